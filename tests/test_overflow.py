"""Budgets: a latency-sensitive request goes past a preferred provider predicted to miss
its time-to-first-token budget (reason ``overflow:FROM``), and a first-token deadline
from the budget fails over from an endpoint that has sent nothing."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
from stack import FAST, Stack, gateway, simulators

from latgate.commands.sim import SimOptions

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
LATENCY = {"X-Latency-Sensitive": "1"}
TEMPLATE = """
[providers.tile-rt]
api_base = "{tile}/v1"
role = "decode"
max_batch_size = 1
[providers.vllm]
api_base = "{vllm}/v1"
role = "prefill"
[providers.hosted]
api_base = "{hosted}/v1"
role = "upstream"
[routing]
strategy = "{strategy}"
default_route = "vllm"
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
fallbacks = {{ "tile-rt" = ["hosted", "vllm"] }}
[health]
probe_interval_sec = 0
"""
HOLDING = SimOptions(name="tile-rt", tpot_ms=50.0, tpot_growth_ms=0.0, ttft_overhead_ms=1.0, default_max_tokens=200)


@contextlib.contextmanager
def stack(*, strategy: str = "latgate", tile: SimOptions = HOLDING, extra: str = "") -> Iterator[Stack]:
    options = {"tile-rt": tile, "vllm": SimOptions(name="vllm", **FAST), "hosted": SimOptions(name="hosted", **FAST)}
    with simulators(options) as sims:
        text = TEMPLATE.format(tile=sims["tile-rt"][0], vllm=sims["vllm"][0], hosted=sims["hosted"][0], strategy=strategy)
        with gateway(text + extra) as gw:
            gw.sims = {name: app for name, (_, app) in sims.items()}
            yield gw


@contextlib.contextmanager
def decode_pool_busy(gw: Stack) -> Iterator[None]:
    """One long stream holds the decode pool's only batch slot until the block ends."""
    with httpx.Client(timeout=10) as client:
        body = {**BODY, "max_tokens": 200}
        with client.stream("POST", gw.v1 + "/chat/completions", json=body, headers=LATENCY) as response:
            assert response.headers["x-latgate-provider"] == "tile-rt"
            chunks = response.iter_raw()
            next(chunks)  # the gateway holds it in flight from here on
            yield
            del chunks


def post(gw: Stack, headers: dict[str, str] = LATENCY) -> httpx.Response:
    return httpx.post(gw.v1 + "/chat/completions", json=BODY, headers=headers, timeout=10)


def test_latency_sensitive_traffic_overflows_a_saturated_decode_pool_with_its_reason() -> None:
    with stack() as gw:
        with decode_pool_busy(gw):
            response = post(gw)
        assert response.status_code == 200
        assert response.headers["x-latgate-route-reason"] == "overflow:tile-rt"
        # the fallback chain puts "hosted" first, but "vllm" is predicted to meet the budget
        assert response.headers["x-latgate-provider"] == "vllm"
        assert gw.sims["tile-rt"].stats.requests_total == 1 and gw.sims["hosted"].stats.requests_total == 0
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'latgate_overflows_total{from="tile-rt",to="vllm"} 1.0' in metrics


def test_a_decode_pool_with_room_keeps_latency_sensitive_traffic() -> None:
    with stack() as gw:
        response = post(gw)
        assert response.headers["x-latgate-provider"] == "tile-rt"
        assert response.headers["x-latgate-route-reason"] == "latency_sensitive"


def test_a_request_without_a_budget_waits_for_its_provider() -> None:
    with stack() as gw, decode_pool_busy(gw):
        response = post(gw, headers={"X-Route-To": "tile-rt"})  # no budget: routing rules only
        assert response.headers["x-latgate-provider"] == "vllm"  # overrides are off: the default
        response = post(gw, headers={"X-Latency-Budget-Ms": "5000"})  # a budget the queue meets
        assert response.headers["x-latgate-provider"] == "vllm" and response.headers["x-latgate-route-reason"] == "default"


def test_a_generous_budget_waits_in_the_queue_rather_than_overflow() -> None:
    with stack(extra='[routing.policies.patient]\nlatency_sensitive = true\nlatency_budget_ms = 60000\n') as gw:
        with decode_pool_busy(gw):
            response = post(gw, headers={"X-Route-Policy": "patient"})
        assert response.headers["x-latgate-provider"] == "tile-rt"
        assert response.headers["x-latgate-route-reason"] == "waited:tile-rt", "in the gateway queue (latgate.routing.admission)"


def test_round_robin_baseline_never_overflows() -> None:
    with stack(strategy="round_robin") as gw:
        with decode_pool_busy(gw):
            response = post(gw)
        assert response.headers["x-latgate-provider"] == "tile-rt"
        assert response.headers["x-latgate-route-reason"] == "latency_sensitive"


def test_the_budget_fails_over_from_a_stalled_endpoint_before_the_first_byte() -> None:
    stalled = SimOptions(name="tile-rt", ttft_overhead_ms=5000.0, tpot_ms=0.5, default_max_tokens=4)
    with stack(tile=stalled) as gw:
        started = time.perf_counter()
        response = post(gw)
        elapsed = time.perf_counter() - started
        assert response.status_code == 200 and response.headers["x-latgate-route-reason"] == "fallback:tile-rt"
        assert elapsed < 2.0, f"failover took {elapsed:.2f}s: the 200 ms budget was not enforced"
        assert gw.sims["tile-rt"].stats.disconnected_event.wait(5), "the stalled upstream was not closed"


def test_the_budget_gives_up_on_nothing_when_the_same_endpoint_is_all_that_is_left() -> None:
    """One provider, one endpoint, retries allowed: cutting its slow first token short
    would only send the request to the same endpoint again, counted as a timeout."""
    config = (
        '[defaults]\nmax_retries = 1\n[providers.vllm]\napi_base = "{url}/v1"\n'
        "[routing]\nlatency_threshold_ms = 200\n[health]\nprobe_interval_sec = 0\n"
    )
    slow = SimOptions(name="vllm", ttft_overhead_ms=600.0, tpot_ms=0.5, default_max_tokens=4)
    with simulators({"vllm": slow}) as sims, gateway(config.format(url=sims["vllm"][0])) as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=BODY, headers={"X-Latency-Budget-Ms": "200"}, timeout=10)
        metrics = httpx.get(gw.url + "/metrics", timeout=10).text
        assert response.status_code == 200 and "data: [DONE]" in response.text
        assert sims["vllm"][1].stats.requests_total == 1
    assert 'latgate_retries_total{provider="vllm"} 0.0' in metrics
    assert 'latgate_upstream_errors_total{kind="timeout"' not in metrics


def test_baselines_wait_for_a_slow_first_token_whatever_the_budget() -> None:
    slow = SimOptions(name="tile-rt", ttft_overhead_ms=400.0, tpot_ms=0.5, default_max_tokens=4)
    with stack(tile=slow, strategy="least_outstanding") as gw:
        started = time.perf_counter()
        response = post(gw)
        assert time.perf_counter() - started >= 0.4
        assert response.headers["x-latgate-provider"] == "tile-rt"
        assert response.headers["x-latgate-route-reason"] == "latency_sensitive"
