"""Deadline-aware admission: the policy on plain data, the holder on an injected clock."""

from __future__ import annotations

import asyncio
import math

import pytest
from clocks import ManualClock

from latgate.config import load_config_text
from latgate.metrics import Metrics
from latgate.providers import ProviderPool
from latgate.routing.admission import Admission, fits_budget, predicted_wait_ms
from latgate.routing.decision import Router

CONFIG = """
[providers.tile-rt]
api_base = "http://127.0.0.1:9/v1"
connector = "tile_rt_connector"
role = "decode"
models = ["m"]
max_batch_size = 2

[providers.vllm]
api_base = "http://127.0.0.1:9/v1"
role = "prefill"
models = ["m"]

[routing]
default_route = "vllm"
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
fallbacks = { "tile-rt" = ["vllm"] }
"""
LATENCY = {"x-latency-sensitive": "1"}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def setup(*, admission: bool = True, slot_seconds: float = 0.3):
    config = load_config_text(CONFIG, source="test.toml")
    clock = ManualClock(0.0)
    metrics = Metrics(providers=config.providers, models=["m"])
    pool = ProviderPool(config, metrics=metrics, env={}, clock=clock)
    for ep in pool["tile-rt"].endpoints:
        ep.slot_seconds = slot_seconds  # as if observed: requests hold a node 300 ms
    return Router(config), pool, Admission(pool=pool, metrics=metrics, enabled=admission), clock, metrics


def fill(pool: ProviderPool, count: int = 2) -> list:
    runtime = pool["tile-rt"]
    return [pool.begin(runtime, runtime.endpoints[0]) for _ in range(count)]


def test_predicted_wait_is_the_next_lease_to_end_for_each_request_already_waiting() -> None:
    assert predicted_wait_ms([300.0, 40.0], ahead=0) == 40.0
    assert predicted_wait_ms([300.0, 40.0], ahead=1) == 300.0
    assert math.isinf(predicted_wait_ms([300.0, 40.0], ahead=2))


def test_a_wait_fits_only_when_wait_plus_ttft_meets_the_budget() -> None:
    assert fits_budget(wait_ms=100.0, ttft_ms=50.0, budget_ms=200)
    assert not fits_budget(wait_ms=160.0, ttft_ms=50.0, budget_ms=200)
    assert not fits_budget(wait_ms=math.inf, ttft_ms=0.0, budget_ms=10**9)


def test_a_latency_sensitive_request_waits_for_the_node_that_frees_within_its_budget() -> None:
    router, pool, admission, clock, metrics = setup()
    tickets = fill(pool)
    clock.now = 0.2  # the leases have 100 ms left; TTFT prior ~20 ms: fits 200 ms

    async def main() -> None:
        decision = router.decide(BODY, LATENCY)
        explain: dict[str, str] = {}
        held = asyncio.ensure_future(admission.hold(decision, explain=explain))
        await asyncio.sleep(0)  # it is waiting now, nothing freed yet
        assert not held.done() and admission.describe()["tile-rt"]["waiting"] == 1
        pool.end(pool["tile-rt"], pool["tile-rt"].endpoints[0], tickets[0])  # a node frees
        after = await held
        assert (after.provider, after.candidates[0].reason) == ("tile-rt", "waited:tile-rt")
        assert explain["admission"].startswith("waited ")
        assert pool["tile-rt"].endpoints[0].pending == 0, "the slot held for it is handed to its plan"

    asyncio.run(main())
    assert admission.describe()["tile-rt"]["admitted"] == 1
    assert 'latgate_admission_wait_seconds_count{outcome="admitted",provider="tile-rt"} 1.0' in metrics.render()[0].decode()


def test_a_request_whose_wait_cannot_fit_goes_to_the_next_candidate_at_once() -> None:
    router, pool, admission, clock, _ = setup()
    fill(pool)
    clock.now = 0.0  # 300 ms left on each lease: over the 200 ms budget

    async def main():
        return await admission.hold(router.decide(BODY, LATENCY))

    after = asyncio.run(main())
    assert (after.provider, after.reason) == ("vllm", "overflow:tile-rt")
    assert admission.describe()["tile-rt"]["declined"] == 1


def test_a_held_request_gives_up_when_its_slack_runs_out() -> None:
    router, pool, admission, clock, _ = setup()
    fill(pool)
    clock.now = 0.25  # predicted 50 ms: it waits, but no node ever frees

    async def main():
        return await admission.hold(router.decide(BODY, {**LATENCY, "x-latency-budget-ms": "100"}))

    after = asyncio.run(main())
    assert (after.provider, after.reason) == ("vllm", "overflow:tile-rt")
    assert admission.describe()["tile-rt"]["timed_out"] == 1


def test_each_waiter_needs_its_own_node_to_free_and_they_are_served_in_order() -> None:
    router, pool, admission, clock, _ = setup()
    runtime = pool["tile-rt"]
    endpoint = runtime.endpoints[0]
    first_lease = pool.begin(runtime, endpoint)
    clock.now = 0.12
    second_lease = pool.begin(runtime, endpoint)
    clock.now = 0.27  # the leases end in 30 ms and in 150 ms

    async def main() -> None:
        first = asyncio.ensure_future(admission.hold(router.decide(BODY, LATENCY)))
        second = asyncio.ensure_future(admission.hold(router.decide(BODY, LATENCY)))
        await asyncio.sleep(0)
        assert admission.describe()["tile-rt"]["waiting"] == 2, "150 ms + TTFT still fits 200 ms"
        third = await admission.hold(router.decide(BODY, LATENCY))
        assert third.reason == "overflow:tile-rt", "no third lease ends"
        pool.end(runtime, endpoint, first_lease)
        assert (await first).reason == "waited:tile-rt"
        assert not second.done()
        pool.begin(runtime, endpoint)  # the first waiter's request takes the node
        pool.end(runtime, endpoint, second_lease)
        assert (await second).reason == "waited:tile-rt"

    asyncio.run(main())


@pytest.mark.parametrize("admission", [True, False])
def test_ordinary_requests_and_admission_off_never_wait(admission: bool) -> None:
    router, pool, holder, clock, _ = setup(admission=admission)
    fill(pool)
    clock.now = 0.2
    headers = LATENCY if not admission else {}

    async def main():
        return await holder.hold(router.decide(BODY, headers))

    after = asyncio.run(main())
    assert after.reason in ("latency_sensitive", "default") and holder.describe()["tile-rt"]["waiting"] == 0


def test_the_lease_time_is_learnt_from_the_requests_that_held_a_node() -> None:
    _, pool, admission, _, _ = setup(slot_seconds=5.0)
    runtime = pool["tile-rt"]
    endpoint = runtime.endpoints[0]
    assert admission.lease_seconds(endpoint) == 5.0, "before any: the endpoint's prior"
    ticket = pool.begin(runtime, endpoint)
    pool.record_outcome(runtime, endpoint, ok=True, ticket=ticket)
    pool.end(runtime, endpoint, ticket)
    assert admission.lease_seconds(endpoint) < 1.0, "the first observation replaces the prior"
    assert admission.describe()["tile-rt"]["lease_ms"]["tile-rt-0"] < 1000.0
