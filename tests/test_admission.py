"""The gateway queue's holder on an injected clock: TileRT's no-queue pool, a vLLM-style
pool with max_batch_size, classes, shedding, overflow (the policy itself: test_queue.py)."""

from __future__ import annotations

import asyncio

import pytest
from queues import ONE_SLOT_POOL, queued_pool

from latgate.foundation.errors import Overloaded
from latgate.live.providers import ProviderPool
from latgate.routing.admission import Admission, Ask
from latgate.routing.priority import BATCH, DEFAULT, INTERACTIVE
from latgate.routing.queue_refuse import fits_budget

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


def setup(*, admission: bool = True, slot_seconds: float = 0.3, text: str = CONFIG):
    # as if observed: requests hold a slot 300 ms
    queued = queued_pool(text, enabled=admission, lease_seconds=slot_seconds)
    return queued.router, queued.pool, queued.admission, queued.clock, queued.metrics


async def hold(admission: Admission, decision, priority: int = DEFAULT, **kwargs):
    """The decision after the queue, for a request that arrived now (the test's clock)."""
    held, _ = await admission.hold(decision, Ask(priority, "k", admission._timer(), 100), **kwargs)
    return held


def fill(pool: ProviderPool, count: int = 2) -> list:
    runtime = pool["tile-rt"]
    return [pool.begin(runtime, runtime.endpoints[0]) for _ in range(count)]


def test_a_wait_fits_only_when_time_so_far_plus_wait_plus_ttft_meets_the_budget() -> None:
    assert fits_budget(elapsed_ms=0.0, wait_ms=100.0, ttft_ms=50.0, budget_ms=200)
    assert not fits_budget(elapsed_ms=60.0, wait_ms=100.0, ttft_ms=50.0, budget_ms=200)


def test_a_latency_sensitive_request_waits_for_the_node_that_frees_within_its_budget() -> None:
    router, pool, admission, clock, metrics = setup()
    tickets = fill(pool)
    clock.now = 0.2  # the leases have 100 ms left; TTFT prior ~20 ms: fits 200 ms

    async def main() -> None:
        decision = router.decide(BODY, LATENCY)
        explain: dict[str, str] = {}
        held = asyncio.ensure_future(hold(admission, decision, explain=explain))
        await asyncio.sleep(0)  # it is waiting now, nothing freed yet
        assert not held.done() and admission.describe()["tile-rt"]["waiting"] == 1
        pool.end(pool["tile-rt"], pool["tile-rt"].endpoints[0], tickets[0])  # a node frees
        after = await held
        assert (after.provider, after.candidates[0].reason) == ("tile-rt", "waited:tile-rt")
        assert explain["admission"].startswith("waited ")
        assert pool["tile-rt"].endpoints[0].pending == 0, "the slot held for it is handed to its plan"

    asyncio.run(main())
    assert admission.describe()["tile-rt"]["admitted"] == 1
    assert 'latgate_queue_wait_seconds_count{outcome="admitted",priority="default",provider="tile-rt"} 1.0' in metrics.render()[0].decode()


def test_a_request_whose_wait_cannot_fit_goes_to_the_next_candidate_at_once() -> None:
    router, pool, admission, clock, _ = setup()
    fill(pool)
    clock.now = 0.0  # 300 ms left on each lease: over the 200 ms budget

    async def main():
        return await hold(admission, router.decide(BODY, LATENCY))

    after = asyncio.run(main())
    assert (after.provider, after.reason) == ("vllm", "overflow:tile-rt")
    assert admission.describe()["tile-rt"]["overflow"] == 1


def test_a_held_request_gives_up_when_its_slack_runs_out() -> None:
    router, pool, admission, clock, _ = setup()
    fill(pool)
    clock.now = 0.25  # predicted 50 ms: it waits, but no node ever frees

    async def main():
        return await hold(admission, router.decide(BODY, {**LATENCY, "x-latency-budget-ms": "100"}))

    after = asyncio.run(main())
    assert (after.provider, after.reason) == ("vllm", "overflow:tile-rt")
    assert admission.describe()["tile-rt"]["overflow"] == 1


def test_each_waiter_needs_its_own_node_to_free_and_they_are_served_in_order() -> None:
    router, pool, admission, clock, _ = setup()
    runtime = pool["tile-rt"]
    endpoint = runtime.endpoints[0]
    first_lease = pool.begin(runtime, endpoint)
    clock.now = 0.08
    second_lease = pool.begin(runtime, endpoint)
    clock.now = 0.27  # the leases end in 30 ms and in 110 ms

    async def main() -> None:
        first = asyncio.ensure_future(hold(admission, router.decide(BODY, LATENCY)))
        second = asyncio.ensure_future(hold(admission, router.decide(BODY, LATENCY)))
        await asyncio.sleep(0)
        assert admission.describe()["tile-rt"]["waiting"] == 2, "110 ms (x 1.25 with an overflow to go to) + TTFT still fits 200 ms"
        third = await hold(admission, router.decide(BODY, LATENCY))
        assert third.reason == "overflow:tile-rt", "no third lease ends"
        pool.end(runtime, endpoint, first_lease)
        assert (await first).reason == "waited:tile-rt"
        assert not second.done()
        pool.begin(runtime, endpoint)  # the first waiter's request takes the node
        pool.end(runtime, endpoint, second_lease)
        assert (await second).reason == "waited:tile-rt"

    asyncio.run(main())


def test_with_the_queue_off_nothing_waits() -> None:
    router, pool, holder, clock, _ = setup(admission=False)
    fill(pool)
    clock.now = 0.2

    async def held():
        return await hold(holder, router.decide(BODY, LATENCY))

    after = asyncio.run(held())
    assert after.reason == "latency_sensitive" and holder.describe()["tile-rt"]["waiting"] == 0


def test_the_lease_time_is_learnt_from_the_requests_that_held_a_node() -> None:
    _, pool, admission, _, _ = setup(slot_seconds=5.0)
    runtime = pool["tile-rt"]
    endpoint = runtime.endpoints[0]
    admission.outlook.leases.clear()
    assert admission.lease_seconds(endpoint) > 1.0, "before any: TTFT plus the expected tokens times the time per token"
    ticket = pool.begin(runtime, endpoint)
    pool.record_outcome(runtime, endpoint, ok=True, ticket=ticket)
    pool.end(runtime, endpoint, ticket)
    assert admission.lease_seconds(endpoint) < 1.0, "the first observation replaces the prior"
    assert admission.describe()["tile-rt"]["lease_ms"]["tile-rt-0"] < 1000.0


POOL = ONE_SLOT_POOL + """
[routing.queue]
batch_max_wait_ms = {batch_wait}
"""


def vllm_setup(batch_wait: int = 10_000):
    router, pool, holder, _, _ = setup(text=POOL.format(batch_wait=batch_wait))
    runtime = pool["vllm"]
    return router, pool, holder, runtime, runtime.endpoints[0]


def test_on_a_full_pool_an_interactive_request_takes_the_slot_before_batch_requests_queued_earlier() -> None:
    router, pool, holder, runtime, endpoint = vllm_setup()
    lease = pool.begin(runtime, endpoint)

    async def main() -> None:
        batch = [asyncio.ensure_future(hold(holder, router.decide(BODY, {}), BATCH)) for _ in range(2)]
        await asyncio.sleep(0)
        interactive = asyncio.ensure_future(hold(holder, router.decide(BODY, {}), INTERACTIVE))
        await asyncio.sleep(0)
        assert holder.describe()["vllm"]["waiting_by_priority"] == {"batch": 2, "default": 0, "interactive": 1}
        pool.end(runtime, endpoint, lease)  # the one slot frees
        assert (await interactive).reason == "waited:vllm"
        assert not any(task.done() for task in batch), "the batch requests still wait"
        for task in batch:
            pool.end(runtime, endpoint, pool.begin(runtime, endpoint))  # the request before it ends
            assert (await task).reason == "waited:vllm"

    asyncio.run(main())


def test_a_pool_whose_capacity_is_unknown_has_no_queue() -> None:
    router, pool, holder, _, _ = setup()
    runtime = pool["vllm"]
    for _ in range(50):
        pool.begin(runtime, runtime.endpoints[0])

    async def main():
        return await hold(holder, router.decide(BODY, {}), BATCH)

    assert asyncio.run(main()).reason == "default"
    assert holder.describe()["vllm"]["waiting"] == 0


def test_a_batch_request_that_cannot_wait_within_its_bound_is_shed_at_once_with_retry_after() -> None:
    router, pool, holder, runtime, endpoint = vllm_setup(batch_wait=100)  # the lease has 300 ms left
    pool.begin(runtime, endpoint)

    async def main():
        return await hold(holder, router.decide(BODY, {}), BATCH)

    with pytest.raises(Overloaded) as shed:
        asyncio.run(main())
    assert shed.value.status == 503 and shed.value.headers == {"retry-after": "1"}
    assert "at capacity" in shed.value.message and "batch request not queued" in shed.value.message
    assert holder.describe()["vllm"]["shed"] == 1


def test_a_queued_batch_request_is_shed_from_a_full_queue_for_an_interactive_one() -> None:
    text = POOL.format(batch_wait=10_000) + "max_waiting = 1\n"
    router, pool, holder, _, _ = setup(text=text)
    runtime = pool["vllm"]
    pool.begin(runtime, runtime.endpoints[0])

    async def main() -> None:
        batch = asyncio.ensure_future(hold(holder, router.decide(BODY, {}), BATCH))
        await asyncio.sleep(0)
        interactive = asyncio.ensure_future(hold(holder, router.decide(BODY, {}), INTERACTIVE))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded):
            await batch
        assert not interactive.done() and holder.describe()["vllm"]["waiting_by_priority"]["interactive"] == 1
        interactive.cancel()

    asyncio.run(main())


def test_a_waiter_whose_slot_comes_too_late_for_its_budget_goes_elsewhere_and_passes_the_slot_on() -> None:
    router, pool, admission, clock, _ = setup()
    tickets = fill(pool)
    clock.now = 0.2  # 100 ms left on the leases; TTFT prior ~20 ms: fits 200 ms

    async def main() -> None:
        held = asyncio.ensure_future(hold(admission, router.decide(BODY, LATENCY)))
        await asyncio.sleep(0)
        assert admission.describe()["tile-rt"]["waiting"] == 1
        clock.now = 0.39  # 190 ms after it arrived: its first token could no longer come within 200 ms
        pool.end(pool["tile-rt"], pool["tile-rt"].endpoints[0], tickets[0])
        after = await held
        assert (after.provider, after.reason) == ("vllm", "overflow:tile-rt")
        assert pool["tile-rt"].endpoints[0].pending == 0, "the slot it was given is free again"

    asyncio.run(main())


def test_with_somewhere_else_to_go_a_request_waits_only_when_its_pessimistic_wait_fits() -> None:
    router, pool, admission, clock, _ = setup()
    fill(pool)
    clock.now = 0.15  # 150 ms left: 150 + TTFT fits 200 ms, 1.25 x 150 + TTFT does not

    async def main():
        return await hold(admission, router.decide(BODY, LATENCY))

    assert asyncio.run(main()).reason == "overflow:tile-rt"


def test_the_wait_prediction_is_corrected_by_the_waits_that_came_true() -> None:
    router, pool, admission, clock, _ = setup()
    tickets = fill(pool)
    clock.now = 0.25  # predicted: 50 ms

    async def main() -> None:
        held = asyncio.ensure_future(hold(admission, router.decide(BODY, {**LATENCY, "x-latency-budget-ms": "400"})))
        await asyncio.sleep(0)
        clock.now = 0.35  # the node freed after 100 ms
        pool.end(pool["tile-rt"], pool["tile-rt"].endpoints[0], tickets[0])
        assert (await held).reason == "waited:tile-rt"

    asyncio.run(main())
    assert admission.describe()["tile-rt"]["wait_correction"] == {"default": 2.0}, "twice as long as predicted"


def test_a_shed_batch_requests_retry_after_is_its_predicted_wait() -> None:
    router, pool, holder, runtime, endpoint = vllm_setup(batch_wait=1000)
    holder.outlook.leases[endpoint.key] = 2.5  # the running request holds its slot 2.5 s
    pool.begin(runtime, endpoint)
    with pytest.raises(Overloaded) as shed:
        asyncio.run(hold(holder, router.decide(BODY, {}), BATCH))
    assert shed.value.headers["retry-after"] == "3", "2.5 s predicted, rounded up"


def test_a_cold_full_pool_predicts_a_wait_from_its_capacity_not_zero() -> None:
    _, pool, holder, runtime, endpoint = vllm_setup(batch_wait=1)
    holder.outlook.leases.clear()  # nothing observed yet
    ticket = pool.begin(runtime, endpoint)
    lease_ms = holder.lease_seconds(endpoint) * 1000.0
    pool.clock.now += lease_ms / 1000.0 + 1.0  # the running request outlived the prior lease
    view = holder.outlook.view(runtime, 10, pool.clock())
    assert view is not None and view.cold
    assert holder.outlook.predict_ms(view, ahead=0) >= lease_ms, "a slot frees every lease / slots"
    assert holder.outlook.predict_ms(view, ahead=1) >= 2 * lease_ms
    pool.end(runtime, endpoint, ticket)


def test_a_reload_keeps_the_queues_counters_correction_and_leases() -> None:
    router, pool, holder, runtime, endpoint = vllm_setup(batch_wait=1)
    pool.begin(runtime, endpoint)
    with pytest.raises(Overloaded):
        asyncio.run(hold(holder, router.decide(BODY, {}), BATCH))
    holder.outlook.learn("vllm", BATCH, predicted_ms=100.0, actual_ms=300.0)
    _, _, fresh, _, _ = vllm_setup()
    fresh.outlook.leases.clear()
    fresh.carry_from(holder)
    after = fresh.describe()["vllm"]
    assert after["shed"] == 1 and after["wait_correction"] == {"batch": 3.0}
    assert after["lease_ms"] == {"vllm-0": 300.0}


def test_a_batch_request_leaves_the_headroom_slot_to_the_other_classes() -> None:
    router, pool, holder, _, _ = setup(text=POOL.format(batch_wait=10_000).replace("max_batch_size = 1", "max_batch_size = 8"))
    runtime = pool["vllm"]
    endpoint = runtime.endpoints[0]
    tickets = [pool.begin(runtime, endpoint) for _ in range(7)]  # one slot free: the headroom

    async def main() -> None:
        batch = asyncio.ensure_future(hold(holder, router.decide(BODY, {}), BATCH))
        await asyncio.sleep(0)
        assert holder.describe()["vllm"]["waiting_by_priority"]["batch"] == 1, "the batch request waits"
        interactive = await hold(holder, router.decide(BODY, {}), INTERACTIVE)
        assert interactive.reason != "waited:vllm", "the interactive one takes the free slot at once"
        pool.begin(runtime, endpoint)  # it started there: 8 of 8
        pool.end(runtime, endpoint, tickets.pop())  # one frees: still only the headroom is free
        await asyncio.sleep(0)
        assert not batch.done()
        pool.end(runtime, endpoint, tickets.pop())  # two free: one for the batch request
        assert (await batch).reason == "waited:vllm"

    asyncio.run(main())


def test_a_budgeted_request_is_not_refused_for_its_own_clients_waiters_it_goes_before() -> None:
    router, pool, holder, runtime, endpoint = vllm_setup()
    lease = pool.begin(runtime, endpoint)
    holder._timer.now = 0.2  # the one slot frees in 100 ms; a new lease holds it 300 ms

    async def main() -> None:
        ordinary = [asyncio.ensure_future(hold(holder, router.decide(BODY, {}))) for _ in range(3)]
        await asyncio.sleep(0)
        assert holder.describe()["vllm"]["waiting"] == 3
        budgeted = asyncio.ensure_future(hold(holder, router.decide(BODY, {"x-latency-budget-ms": "400"})))
        await asyncio.sleep(0)
        assert not budgeted.done(), "100 ms to the first slot + TTFT fits 400 ms: the three ordinary ones (30 s to go) come after it"
        pool.end(runtime, endpoint, lease)
        assert (await budgeted).reason == "waited:vllm"
        assert not any(task.done() for task in ordinary)
        for task in ordinary:
            task.cancel()

    asyncio.run(main())


BUDGET = {"x-latency-budget-ms": "500"}


def test_an_interactive_request_on_a_full_single_pool_with_no_overflow_target_is_served_late_rather_than_503() -> None:
    router, pool, holder, _, metrics = setup(text=POOL.format(batch_wait=10_000))
    runtime = pool["vllm"]
    endpoint = runtime.endpoints[0]
    holder.outlook.leases[endpoint.key] = 2.5  # the running request holds the one slot 2.5 s: 500 ms cannot be met
    lease = pool.begin(runtime, endpoint)

    async def main() -> None:
        late = asyncio.ensure_future(hold(holder, router.decide(BODY, BUDGET), INTERACTIVE))
        await asyncio.sleep(0)
        assert not late.done() and holder.describe()["vllm"]["waiting_by_priority"]["interactive"] == 1, "not refused: it waits"
        holder._timer.now += 2.5
        pool.end(runtime, endpoint, lease)
        assert (await late).reason == "late:vllm", "served best-effort, its budget missed"

    asyncio.run(main())
    queue = holder.describe()["vllm"]
    assert (queue["late"], queue["admitted"], queue["shed"], queue["overflow"]) == (1, 0, 0, 0)
    assert 'latgate_queue_wait_seconds_count{outcome="late",priority="interactive",provider="vllm"} 1.0' in metrics.render()[0].decode()


def test_a_request_served_late_still_gets_503_when_its_wait_is_past_its_class_longest_wait() -> None:
    router, pool, holder, _, _ = setup(text=POOL.format(batch_wait=10_000) + "max_wait_ms = 1000\n")  # the TTL
    runtime = pool["vllm"]
    endpoint = runtime.endpoints[0]
    holder.outlook.leases[endpoint.key] = 2.5
    pool.begin(runtime, endpoint)
    with pytest.raises(Overloaded) as refused:
        asyncio.run(hold(holder, router.decide(BODY, BUDGET), INTERACTIVE))
    assert refused.value.status == 503 and refused.value.headers == {"retry-after": "3"}
    assert "interactive request not queued" in refused.value.message
    assert holder.describe()["vllm"]["shed"] == 1


def test_a_batch_request_with_a_budget_it_cannot_meet_is_still_shed_at_once() -> None:
    router, pool, holder, runtime, endpoint = vllm_setup()
    holder.outlook.leases[endpoint.key] = 2.5
    pool.begin(runtime, endpoint)
    with pytest.raises(Overloaded) as shed:
        asyncio.run(hold(holder, router.decide(BODY, BUDGET), BATCH))
    assert shed.value.status == 503 and "batch request not queued" in shed.value.message


def test_a_request_served_late_waits_in_its_budgets_deadline_place_not_its_longest_waits() -> None:
    router, pool, holder, runtime, endpoint = vllm_setup()
    holder.outlook.leases[endpoint.key] = 2.5
    lease = pool.begin(runtime, endpoint)

    async def main() -> None:
        unbudgeted = asyncio.ensure_future(hold(holder, router.decide(BODY, {}), DEFAULT))  # deadline: 30 s from now
        await asyncio.sleep(0)
        budgeted = asyncio.ensure_future(hold(holder, router.decide(BODY, BUDGET), DEFAULT))  # deadline already past
        await asyncio.sleep(0)
        assert holder.describe()["vllm"]["waiting"] == 2
        pool.end(runtime, endpoint, lease)
        assert (await budgeted).reason in ("waited:vllm", "late:vllm")
        assert not unbudgeted.done(), "it queued first but its deadline is later"
        unbudgeted.cancel()

    asyncio.run(main())
