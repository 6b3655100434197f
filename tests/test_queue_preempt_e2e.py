"""A preempted request end to end, on every route: a one-slot vLLM-style pool behind the
gateway, a ``batch`` stream admitted and waiting for its first token, then an
``interactive`` request that can meet its budget only with that slot. The batch stream is
cut; it goes back to the queue when the queue can take it back within the bounds it
applies to any request (predicted wait against the slack left, count, longest wait), and
is then answered whole; else it gets 503 with ``x-latgate-preempted`` and ``Retry-After``
in its API's envelope at once, never a queue shed after the requeue and never part of a
stream. latgate's own 503 is not the provider's: it is counted under provider ``none``."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from h1_upstreams import access_lines
from stack import requests_total_in
from test_queue_e2e import ASK, MODEL, poll, pool_stack, queue_of

from latgate.commands.sim import SimOptions

#: the batch attempt's first token comes after 1.5 s: it is still preemptible when the
#: interactive request (budget 3 s) arrives
SLOW_FIRST_TOKEN = SimOptions(name="vllm", ttft_overhead_ms=1500.0, tpot_ms=1.0, default_max_tokens=4)
STREAMS = [
    ("/chat/completions", {"model": MODEL, "messages": ASK, "stream": True}),
    ("/completions", {"model": MODEL, "prompt": "hi", "stream": True}),
    ("/messages", {"model": MODEL, "messages": ASK, "max_tokens": 8, "stream": True}),
    ("/responses", {"model": MODEL, "input": "hi", "stream": True}),
]
INTERACTIVE = {"X-Latgate-Priority": "interactive", "X-Latency-Budget-Ms": "3000"}


def preempted_on(
    path: str, body: dict[str, Any], queue: str
) -> tuple[httpx.Response, httpx.Response, dict[str, Any], str]:
    """A batch stream on ``path`` admitted and waiting for its first token, then an
    interactive chat stream that preempts it: (interactive, batch, queue state, /metrics)."""
    with pool_stack(SLOW_FIRST_TOKEN, queue=queue) as stack, ThreadPoolExecutor(1) as threads:
        batch = threads.submit(
            httpx.post, stack.v1 + path, json=body, headers={"X-Latgate-Priority": "batch"}, timeout=30
        )
        endpoint = lambda: httpx.get(stack.url + "/admin/providers").json()["providers"]["vllm"]["endpoints"][
            0
        ]
        poll(lambda: endpoint()["in_flight"] == 1)  # admitted, waiting for its first token
        chat = {"model": MODEL, "messages": ASK, "stream": True}
        interactive = httpx.post(stack.v1 + "/chat/completions", json=chat, headers=INTERACTIVE, timeout=30)
        preempted = batch.result()
        return interactive, preempted, queue_of(stack), httpx.get(stack.url + "/metrics").text


@pytest.mark.parametrize(("path", "body"), STREAMS, ids=[s[0] for s in STREAMS])
def test_a_preempted_stream_the_queue_cannot_take_back_gets_its_503_at_once_never_a_shed_or_a_partial_stream(
    path: str, body: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # 3 s of longest wait: not over when it is cut, but shorter than the wait predicted
    # behind the interactive stream on a cold pool (a lease per request ahead)
    caplog.set_level(logging.INFO, logger="latgate.access")
    interactive, preempted, admin, metrics = preempted_on(path, body, "batch_max_wait_ms = 3000")
    assert interactive.status_code == 200 and interactive.text.rstrip().endswith("data: [DONE]"), (
        interactive.text
    )
    assert preempted.status_code == 503, preempted.text
    assert preempted.headers["x-latgate-preempted"] == "1" and int(preempted.headers["retry-after"]) >= 1
    assert "data:" not in preempted.text and "event:" not in preempted.text, "never part of a stream"
    answer = preempted.json()
    if path == "/messages":
        assert answer["type"] == "error" and answer["error"]["type"] == "overloaded_error"
    else:
        assert answer["error"]["code"] == "preempted"
    assert "preempted" in answer["error"]["message"] and "cannot wait again" in answer["error"]["message"]
    (line,) = [line for line in access_lines(caplog) if line["priority"] == "batch"]
    assert (line["status"], line["error"], line["queue_outcome"]) == (503, "preempted", "preempted")
    assert (admin["preempted"], admin["shed"]) == (1, 0)
    assert (
        'latgate_queue_wait_seconds_count{outcome="preempted",priority="batch",provider="vllm"} 1.0'
        in metrics
    )
    assert 'outcome="shed"' not in metrics
    assert requests_total_in(metrics, 503, provider="vllm") == 0, (
        "latgate's own 503 is not the provider's 5xx"
    )
    assert requests_total_in(metrics, 503, provider="none") == 1


#: per route: what opens its stream (once in one whole answer) and how its last line starts
WHOLE = {
    "/chat/completions": ('"role":"assistant"', "data: [DONE]"),
    "/completions": ("data: [DONE]", "data: [DONE]"),
    "/messages": ("event: message_start", 'data: {"type":"message_stop"'),
    "/responses": ("event: response.created", 'data: {"type":"response.completed"'),
}


@pytest.mark.parametrize(("path", "body"), STREAMS, ids=[s[0] for s in STREAMS])
def test_a_preempted_stream_the_queue_takes_back_is_answered_whole_after_the_interactive_one(
    path: str, body: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    interactive, preempted, admin, metrics = preempted_on(path, body, "batch_max_wait_ms = 30000")
    assert interactive.status_code == 200 and interactive.text.rstrip().endswith("data: [DONE]"), (
        interactive.text
    )
    assert preempted.status_code == 200 and "x-latgate-preempted" not in preempted.headers, preempted.text
    assert preempted.headers["x-latgate-route-reason"] == "waited:vllm"
    opener, last = WHOLE[path]
    assert preempted.text.count(opener) == 1, "one answer, not the cut attempt's start and then its retry"
    assert preempted.text.rstrip().splitlines()[-1].startswith(last), preempted.text[-300:]
    (line,) = [line for line in access_lines(caplog) if line["priority"] == "batch"]
    assert (line["status"], line["queue_outcome"]) == (200, "requeued"), "preempted, then given a slot again"
    assert line["queue_ms"] is not None and line["queue_ms"] >= 0
    assert (admin["preempted"], admin["shed"]) == (1, 0)
    assert requests_total_in(metrics, 200, provider="vllm") == 2


def test_a_held_flood_stream_preempted_mid_generation_into_a_full_queue_gets_its_503_and_none_of_its_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the flood's second stream waits (the queue's one place); its first is held back while
    # it generates (150 tokens at 20 ms: the hold outlasts a loaded machine's polls), cut
    # for an interactive turn, and cannot go back: the queue is full
    caplog.set_level(logging.INFO, logger="latgate.access")
    sim = SimOptions(
        name="vllm", ttft_overhead_ms=500.0, tpot_ms=20.0, tpot_growth_ms=0.0, max_output_tokens=400
    )
    with (
        pool_stack(sim, queue="batch_max_wait_ms = 30000\nmax_waiting = 1") as stack,
        ThreadPoolExecutor(2) as threads,
    ):
        chat = stack.v1 + "/chat/completions"
        body = {"model": MODEL, "messages": ASK, "stream": True, "max_tokens": 150}
        endpoint = lambda: httpx.get(stack.url + "/admin/providers").json()["providers"]["vllm"]["endpoints"][
            0
        ]
        held = threads.submit(
            httpx.post, chat, json=body, headers={"X-Latgate-Priority": "batch"}, timeout=30
        )
        poll(lambda: endpoint()["in_flight"] == 1)
        waiting = threads.submit(
            httpx.post, chat, json=body, headers={"X-Latgate-Priority": "batch"}, timeout=30
        )
        poll(lambda: queue_of(stack)["waiting_by_priority"]["batch"] == 1)
        poll(lambda: endpoint()["ttft_model"]["observations"] == 1)  # the held one's content reached latgate
        interactive = httpx.post(chat, json={**body, "max_tokens": 4}, headers=INTERACTIVE, timeout=30)
        cut, served = held.result(), waiting.result()
        metrics, admin = httpx.get(stack.url + "/metrics").text, queue_of(stack)
    assert admin["preempted"] == 1, f"the held stream was not cut (its hold ended first?): {admin}"
    assert interactive.status_code == 200 and interactive.text.rstrip().endswith("data: [DONE]"), (
        interactive.text
    )
    assert cut.status_code == 503 and cut.headers["x-latgate-preempted"] == "1", cut.text
    assert "data:" not in cut.text and cut.json()["error"]["code"] == "preempted", "none of what it generated"
    assert "queue full" in cut.json()["error"]["message"]
    assert served.status_code == 200 and served.text.count('"role"') == 1, served.text
    outcomes = sorted(
        (line["status"], line["queue_outcome"])
        for line in access_lines(caplog)
        if line["priority"] == "batch"
    )
    assert outcomes == [(200, "admitted"), (503, "preempted")]
    assert (
        requests_total_in(metrics, 503, provider="vllm") == 0
        and requests_total_in(metrics, 503, provider="none") == 1
    )
