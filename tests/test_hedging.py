"""Hedged requests: a second copy when the first token is late; the first to produce
content is forwarded and the other upstream is closed."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterator

import httpx
import pytest
from stack import FAST, Stack, gateway, simulators

from latgate.commands.sim import SimOptions
from latgate.forwarding.hedge import LostRace, Race, run_hedged

# --- the race, on plain coroutines ----------------------------------------------------


class Attempt:
    """A fake attempt: finishes (or fails) when the test says, records a cancellation."""

    def __init__(self) -> None:
        self.started: asyncio.Event | None = None
        self.cancelled = False
        self.outcome: asyncio.Future[object] | None = None

    def arm(self) -> None:
        self.started = asyncio.Event()
        self.outcome = asyncio.get_running_loop().create_future()

    async def __call__(self) -> object:
        assert self.started is not None and self.outcome is not None
        self.started.set()
        try:
            return await self.outcome
        except asyncio.CancelledError:
            self.cancelled = True
            raise


NEVER = 60.0  # a hedge delay no test waits for
AT_ONCE = 0.0


def race(script, *, delay_seconds: float) -> tuple[object, Attempt, Attempt]:
    first, second = Attempt(), Attempt()

    async def main() -> object:
        first.arm()
        second.arm()
        task = asyncio.ensure_future(run_hedged(first, second, delay_seconds=delay_seconds))
        await script(first, second)
        return await task

    return asyncio.run(main()), first, second


def test_a_late_first_attempt_is_hedged_and_the_faster_copy_wins() -> None:
    async def script(first: Attempt, second: Attempt) -> None:
        await second.started.wait()
        second.outcome.set_result("from second")

    result, first, _ = race(script, delay_seconds=AT_ONCE)
    assert result == ("from second", True)
    assert first.cancelled, "the loser is cancelled (its upstream closed)"


def test_a_first_attempt_answering_in_time_sends_no_hedge() -> None:
    async def script(first: Attempt, second: Attempt) -> None:
        await first.started.wait()
        first.outcome.set_result("from first")

    result, _, second = race(script, delay_seconds=NEVER)
    assert result == ("from first", False)
    assert not second.started.is_set()


def test_a_first_attempt_failing_before_the_delay_is_not_hedged() -> None:
    async def script(first: Attempt, second: Attempt) -> None:
        await first.started.wait()
        first.outcome.set_exception(RuntimeError("refused"))

    with pytest.raises(RuntimeError, match="refused"):
        race(script, delay_seconds=NEVER)


def test_when_the_copy_fails_the_first_attempt_can_still_win() -> None:
    async def script(first: Attempt, second: Attempt) -> None:
        await second.started.wait()
        second.outcome.set_exception(RuntimeError("copy failed"))
        await asyncio.sleep(0)
        first.outcome.set_result("from first")

    result, _, _ = race(script, delay_seconds=AT_ONCE)
    assert result == ("from first", False)


def test_when_both_fail_the_last_real_failure_is_raised() -> None:
    async def script(first: Attempt, second: Attempt) -> None:
        await second.started.wait()
        first.outcome.set_exception(RuntimeError("first failed"))
        second.outcome.set_exception(LostRace())

    with pytest.raises(RuntimeError, match="first failed"):
        race(script, delay_seconds=AT_ONCE)


def test_only_the_first_claim_wins() -> None:
    r = Race()
    assert r.claim() and not r.claim()


# --- end to end: two decode endpoints, the first one stalls -----------------------------

TEMPLATE = """
[providers.tile-rt]
endpoints = ["{slow}/v1", "{fast}/v1"]
role = "decode"
[providers.vllm]
api_base = "{vllm}/v1"
role = "prefill"
[routing]
strategy = "{strategy}"
default_route = "vllm"
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
[routing.policies.interactive]
latency_sensitive = true
hedge = true
[health]
probe_interval_sec = 0
"""
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
HEDGED = {"X-Route-Policy": "interactive"}


@contextlib.contextmanager
def stack(*, strategy: str = "latgate", slow_ttft_ms: float = 3000.0) -> Iterator[Stack]:
    options = {
        "slow": SimOptions(name="slow", ttft_overhead_ms=slow_ttft_ms, tpot_ms=0.5, default_max_tokens=4),
        "fast": SimOptions(name="fast", **FAST),
        "vllm": SimOptions(name="vllm", **FAST),
    }
    with simulators(options) as sims:
        text = TEMPLATE.format(slow=sims["slow"][0], fast=sims["fast"][0], vllm=sims["vllm"][0], strategy=strategy)
        with gateway(text) as gw:
            gw.sims = {name: app for name, (_, app) in sims.items()}
            yield gw


def test_hedging_forwards_the_fast_copy_and_closes_the_stalled_upstream() -> None:
    with stack() as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=BODY, headers={**HEDGED, "X-Latgate-Debug": "1"}, timeout=10)
        assert response.status_code == 200
        assert response.text.rstrip().endswith("data: [DONE]")
        # both endpoints were equally unknown: the first attempt went to the first, which stalled
        assert gw.sims["slow"].stats.requests_total == 1 and gw.sims["fast"].stats.requests_total == 1
        assert gw.sims["slow"].stats.disconnected_event.wait(5), "the losing upstream was not closed"
        assert gw.sims["slow"].stats.completed == 0
        assert response.headers["x-latgate-provider"] == "tile-rt"
        assert response.headers["x-latgate-route-reason"] == "latency_sensitive"
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'latgate_hedges_total{provider="tile-rt"} 1.0' in metrics
        assert 'latgate_hedge_wins_total{provider="tile-rt"} 1.0' in metrics
        assert 'latgate_in_flight_requests{provider="tile-rt"} 0.0' in metrics
        endpoints = httpx.get(gw.url + "/admin/providers").json()["providers"]["tile-rt"]["endpoints"]
        assert endpoints[0]["ttft_model"]["observations"] == 1, "the cancelled attempt still taught a lower bound"
        assert endpoints[0]["predicted_ttft_ms_at_1k_tokens"] > endpoints[1]["predicted_ttft_ms_at_1k_tokens"]


def test_after_a_hedge_the_stalled_endpoint_is_avoided() -> None:
    with stack() as gw:
        httpx.post(gw.v1 + "/chat/completions", json=BODY, headers=HEDGED, timeout=10)
        for _ in range(3):
            assert httpx.post(gw.v1 + "/chat/completions", json=BODY, headers=HEDGED, timeout=10).status_code == 200
        assert gw.sims["slow"].stats.requests_total == 1 and gw.sims["fast"].stats.requests_total == 4


def test_without_the_hedge_policy_nothing_is_hedged() -> None:
    with stack(slow_ttft_ms=300.0) as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=BODY, headers={"X-Latency-Budget-Ms": "1000"}, timeout=10)
        assert response.status_code == 200
        assert not re.search(r'latgate_hedges_total\{provider="[^"]+"\} [1-9]', httpx.get(gw.url + "/metrics").text)


def test_baseline_strategies_do_not_hedge() -> None:
    with stack(strategy="round_robin", slow_ttft_ms=300.0) as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=BODY, headers=HEDGED, timeout=10)
        assert response.status_code == 200
        assert gw.sims["fast"].stats.requests_total == 0
        assert not re.search(r'latgate_hedges_total\{provider="[^"]+"\} [1-9]', httpx.get(gw.url + "/metrics").text)
