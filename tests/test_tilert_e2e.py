"""latgate in front of TileRT's PD router (the simulator's ``tilert`` profile): what it
reads, what busy means, errors written into the text, usage it did not ask for."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from queues import held_streams as queued_streams
from queues import poll
from stack import FAST, Stack, gateway, simulators

from latgate.commands.sim import SimOptions

MODEL = "glm-5.1"
ASK = [{"role": "user", "content": "hi"}]
LATENCY = {"X-Latency-Sensitive": "1"}
TILERT_FAST = {"ttft_overhead_ms": 1.0, "tpot_ms": 0.5, "default_max_tokens": 8}
CONFIG = """
[defaults]
timeout_sec = 30
connect_timeout_sec = 2
max_retries = 1

[health]
load_interval_sec = {load_interval}
probe_interval_sec = {probe_interval}

[providers.tile-rt]
api_base = "{tile}/v1"
connector = "tile_rt_connector"
role = "decode"
models = ["glm-5.1"]
max_batch_size = 8

[providers.vllm]
api_base = "{vllm}/v1"
connector = "vllm"
role = "prefill"
models = ["glm-5.1"]

[providers.hosted]
api_base = "{hosted}/v1"
role = "upstream"
models = ["glm-5.1"]

[routing]
default_route = "vllm"
latency_threshold_ms = {threshold}
route_latency_sensitive_to = "tile-rt"
fallbacks = {fallbacks}
{routing_extra}
"""


@contextlib.contextmanager
def tilert_stack(
    tile: SimOptions | None = None,
    *,
    load_interval: float = 0.05,
    routing_extra: str = "",
    fallbacks: str = '{ "tile-rt" = ["vllm", "hosted"] }',
    threshold: int = 200,
    probe_interval: float = 0,
    vllm: SimOptions | None = None,
    hosted: SimOptions | None = None,
) -> Iterator[Stack]:
    """A 2-node TileRT router, a vLLM pool and a hosted upstream behind one gateway."""
    options = {
        "tile-rt": tile or SimOptions(profile="tilert", name="tile-rt", decode_nodes=2, **TILERT_FAST),
        "vllm": vllm or SimOptions(name="vllm", **FAST),
        "hosted": hosted or SimOptions(name="hosted", **FAST),
    }
    with simulators(options) as sims:
        urls = {name: url for name, (url, _) in sims.items()}
        text = CONFIG.format(
            tile=urls["tile-rt"], vllm=urls["vllm"], hosted=urls["hosted"], load_interval=load_interval, routing_extra=routing_extra,
            fallbacks=fallbacks, threshold=threshold, probe_interval=probe_interval,
        )
        with gateway(text) as stack:
            stack.sims = {name: app for name, (_, app) in sims.items()}
            stack.sim_urls = urls
            yield stack


def events(text: str) -> list[Any]:
    """The ``data`` of each SSE event, parsed (``[DONE]`` as the string)."""
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


def tile_endpoint(stack: Stack) -> dict[str, Any]:
    return httpx.get(stack.url + "/admin/providers").json()["providers"]["tile-rt"]["endpoints"][0]


def held_streams(
    url: str, count: int, *, headers: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[list[httpx.Response]]:
    """``count`` streamed chat requests to ``url``, held open after their first line."""
    body = {"model": MODEL, "messages": ASK, "stream": True, "max_tokens": 400}
    return queued_streams(url, body, count, headers=headers)


SLOW_TILE = SimOptions(profile="tilert", name="tile-rt", decode_nodes=2, ttft_overhead_ms=1.0, tpot_ms=20.0, max_output_tokens=400)


def test_capacity_and_free_nodes_are_read_from_health_and_pool_status() -> None:
    with tilert_stack(SLOW_TILE, probe_interval=0.05) as stack:
        endpoint = poll(lambda: (e := tile_endpoint(stack))["engine"] and e)
        assert endpoint["capacity"] == 2, "the node count of /pool_status, not max_batch_size = 8"
        assert endpoint["engine"]["running"] == 0
        with held_streams(stack.sim_urls["tile-rt"] + "/v1/chat/completions", 1):
            poll(lambda: tile_endpoint(stack)["engine"]["running"] == 1)
        probed = poll(lambda: (e := tile_endpoint(stack))["probe"] and e["probe"])
        paths = set(stack.sims["tile-rt"].paths)
    assert probed["ok"]
    assert paths == {("GET", "/health"), ("GET", "/pool_status"), ("POST", "/v1/chat/completions")}, (
        "never a path TileRT does not serve (/v1/models, /metrics)"
    )


def test_the_third_latency_sensitive_request_on_a_two_node_pool_overflows_and_never_sees_429() -> None:
    with tilert_stack(SLOW_TILE) as stack:
        poll(lambda: tile_endpoint(stack)["capacity"] == 2)
        chat = stack.v1 + "/chat/completions"
        with held_streams(chat, 2, headers=LATENCY) as held:
            assert [r.headers["x-latgate-provider"] for r in held] == ["tile-rt", "tile-rt"]
            debug = {**LATENCY, "X-Latgate-Debug": "1"}
            third = httpx.post(chat, json={"model": MODEL, "messages": ASK}, headers=debug, timeout=30)
        assert third.status_code == 200
        assert (third.headers["x-latgate-provider"], third.headers["x-latgate-route-reason"]) == ("vllm", "overflow:tile-rt")
        # the leases are predicted to last (a prior) second: not held, or held and given up
        # at its budget on a loaded machine (no node frees here)
        assert third.headers["x-latgate-admission"].startswith(("not held: tile-rt wait ", "gave up on tile-rt"))
        assert stack.sims["tile-rt"].stats.busy_rejections == 0
        assert tile_endpoint(stack)["failures"] == 0


def test_admission_holds_a_latency_sensitive_request_for_a_node_that_frees_within_its_budget() -> None:
    # the nodes are held 1.5 s: the third request comes while both are taken, even on a loaded machine
    tile = SimOptions(profile="tilert", name="tile-rt", decode_nodes=2, ttft_overhead_ms=1.0, tpot_ms=10.0, default_max_tokens=150)
    with tilert_stack(tile, threshold=5000) as stack:
        poll(lambda: tile_endpoint(stack)["capacity"] == 2)
        chat = stack.v1 + "/chat/completions"
        budget = {"X-Latency-Budget-Ms": "4500"}
        body = {"model": MODEL, "messages": ASK}
        with ThreadPoolExecutor(2) as threads:
            held = [threads.submit(httpx.post, chat, json=body, headers=budget, timeout=30) for _ in range(2)]
            poll(lambda: tile_endpoint(stack)["in_flight"] == 2)
            third = httpx.post(chat, json=body, headers={**budget, "X-Latgate-Debug": "1"}, timeout=30)
            assert [f.result().headers["x-latgate-provider"] for f in held] == ["tile-rt", "tile-rt"]
        admin = httpx.get(stack.url + "/admin/providers").json()["providers"]["tile-rt"]["queue"]
        metrics = httpx.get(stack.url + "/metrics").text
    assert third.status_code == 200
    assert (third.headers["x-latgate-provider"], third.headers["x-latgate-route-reason"]) == ("tile-rt", "waited:tile-rt")
    assert third.headers["x-latgate-admission"].startswith("waited ")
    assert admin["admitted"] == 1 and admin["waiting"] == 0
    assert 'latgate_queue_wait_seconds_count{outcome="admitted",priority="default",provider="tile-rt"} 1.0' in metrics
    assert int(third.headers["x-latgate-queue-ms"]) >= 0
    assert stack.sims["tile-rt"].stats.busy_rejections == 0, "it was sent when a node was free"


def test_a_busy_429_moves_the_request_on_at_once_without_retry_or_health_mark() -> None:
    # the nodes are taken by another client, and latgate reads no load: it learns from the 429
    with tilert_stack(SLOW_TILE, load_interval=0) as stack:
        tile = stack.sims["tile-rt"]
        with held_streams(stack.sim_urls["tile-rt"] + "/v1/chat/completions", 2):
            client = openai.OpenAI(base_url=stack.v1, api_key="x", max_retries=0, default_headers=LATENCY)
            raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=ASK)
            assert raw.headers["x-latgate-route-reason"] == "overflow:tile-rt"
            assert raw.headers["x-latgate-provider"] == "vllm" and raw.parse().choices[0].message.content
            assert tile.stats.busy_rejections == 1, "one try, no retry on the busy pool"
        metrics = httpx.get(stack.url + "/metrics").text
        endpoint = tile_endpoint(stack)
    assert 'latgate_overflows_total{from="tile-rt",to="vllm"} 1.0' in metrics
    assert not re.search(r'latgate_upstream_errors_total\{kind="status_429",provider="tile-rt"\} [1-9]', metrics)
    assert not re.search(r'latgate_retries_total\{provider="tile-rt"\} [1-9]', metrics)
    assert endpoint["healthy"] and endpoint["consecutive_failures"] == 0 and endpoint["failures"] == 0


def test_other_string_errors_are_read_as_errors_with_their_message() -> None:
    failing = SimOptions(profile="tilert", name="tile-rt", error_rate=1.0, seed=1, **TILERT_FAST)
    with tilert_stack(failing, fallbacks="{}") as stack:
        r = httpx.post(stack.v1 + "/chat/completions", json={"model": MODEL, "messages": ASK, "stream": True}, headers=LATENCY)
    assert r.status_code == 502
    assert r.json()["error"]["message"] == "provider 'tile-rt': prefill failed (injected fault)"


def test_streamed_completions_get_a_clear_400() -> None:
    with tilert_stack() as stack:
        body = {"model": MODEL, "prompt": "hi", "stream": True}
        r = httpx.post(stack.v1 + "/completions", json=body, headers=LATENCY)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "streaming is supported on /v1/chat/completions" in error["message"]


def test_usage_from_the_finish_chunk_is_counted_and_hidden_from_a_client_that_did_not_ask() -> None:
    with tilert_stack() as stack:
        chat = stack.v1 + "/chat/completions"
        plain = httpx.post(chat, json={"model": MODEL, "messages": ASK, "stream": True}, headers=LATENCY)
        asked = httpx.post(
            chat,
            json={"model": MODEL, "messages": ASK, "stream": True, "stream_options": {"include_usage": True}},
            headers=LATENCY,
        )
        metrics = httpx.get(stack.url + "/metrics").text
    assert plain.headers["x-latgate-provider"] == "tile-rt"
    assert '"usage"' not in plain.text and plain.text.rstrip().endswith("data: [DONE]")
    assert events(plain.text)[-2]["choices"][0]["finish_reason"] == "stop"
    assert '"usage": {"prompt_tokens"' in asked.text
    assert 'latgate_completion_tokens_total{model="glm-5.1",outcome="ok",provider="tile-rt"} 16.0' in metrics


@pytest.mark.parametrize("after", [0, 3])
def test_a_decode_error_is_never_shown_as_text(after: int) -> None:
    failing = SimOptions(profile="tilert", name="tile-rt", decode_error_rate=1.0, decode_error_after_tokens=after, **TILERT_FAST)
    with tilert_stack(failing) as stack:
        r = httpx.post(stack.v1 + "/chat/completions", json={"model": MODEL, "messages": ASK, "stream": True}, headers=LATENCY)
        metrics = httpx.get(stack.url + "/metrics").text
    chunks = events(r.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if isinstance(c, dict) and c.get("choices"))
    assert "decode error" not in text
    if after == 0:  # nothing had reached the client: a failure before the first byte, so the fallback answers
        assert r.headers["x-latgate-provider"] == "vllm" and r.headers["x-latgate-route-reason"] == "fallback:tile-rt"
        assert r.text.rstrip().endswith("data: [DONE]")
    else:  # some text had: the stream ends with an error event, no [DONE]
        assert r.headers["x-latgate-provider"] == "tile-rt"
        assert r.text.count('"content": "') == 3 and "[DONE]" not in r.text
        assert "decode node failed" in chunks[-1]["error"]["message"]
        assert 'latgate_requests_total{code="502",model="glm-5.1",provider="tile-rt"} 1.0' in metrics
    assert 'latgate_upstream_errors_total{kind="decode_error",provider="tile-rt"}' in metrics


def test_a_stream_cut_without_a_finish_chunk_is_a_failed_request() -> None:
    cut = SimOptions(profile="tilert", name="tile-rt", drop_rate=1.0, seed=1, **TILERT_FAST)
    with tilert_stack(cut) as stack:
        r = httpx.post(stack.v1 + "/chat/completions", json={"model": MODEL, "messages": ASK, "stream": True}, headers=LATENCY)
        metrics = httpx.get(stack.url + "/metrics").text
    assert r.status_code == 200 and r.headers["x-latgate-provider"] == "tile-rt"
    assert "[DONE]" not in r.text and '"error"' in r.text.rstrip().splitlines()[-1]
    assert 'latgate_requests_total{code="502",model="glm-5.1",provider="tile-rt"} 1.0' in metrics
