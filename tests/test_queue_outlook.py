"""The gateway queue's wait prediction on plain data and an injected clock: each held
slot priced at its own request's expected completion, a cold pool priced at the waiting
request's own ``max_tokens`` rather than ``[routing] expected_completion_tokens``."""

from __future__ import annotations

import asyncio

from queues import ONE_SLOT_POOL, queued_pool

from latgate.routing.admission import Ask
from latgate.routing.priority import DEFAULT
from latgate.routing.queue_outlook import WaitOutlook, expected_hold_ms

POOL = ONE_SLOT_POOL + "expected_completion_tokens = 256\n"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}


def cold_pool(text: str = POOL):
    queued = queued_pool(text)
    runtime = queued.pool["vllm"]
    return queued, queued.pool, runtime, runtime.endpoints[0], queued.clock


def test_a_held_slot_is_priced_at_its_own_requests_expected_completion_not_the_default() -> None:
    _, pool, runtime, endpoint, clock = cold_pool()
    outlook = WaitOutlook(pool)
    pool.begin(runtime, endpoint, completion_tokens=100)  # a max_tokens 100 request holds the one slot
    clock.now = 0.5
    view = outlook.view(runtime, 10, clock())
    assert view is not None and view.cold
    ttft_ms, itl_ms = endpoint.predictor.predict_ms(0), endpoint.itl.prior_ms
    assert view.remaining_ms == [ttft_ms + 100 * itl_ms - 500.0], "its lease less its age"
    assert outlook.predict_ms(view, ahead=0) == ttft_ms + 100 * itl_ms, "cold: a slot frees every lease / slots"


def test_a_held_slot_is_priced_at_the_learned_time_per_token() -> None:
    _, pool, runtime, endpoint, clock = cold_pool()
    outlook = WaitOutlook(pool)
    endpoint.itl.observe(5.0)  # the endpoint's streams: 5 ms a token
    pool.begin(runtime, endpoint, completion_tokens=100)
    view = outlook.view(runtime, 10, clock())
    assert view is not None
    assert view.remaining_ms == [endpoint.predictor.predict_ms(0) + 100 * 5.0]


def test_short_observed_leases_do_not_price_a_long_requests_slot_before_the_time_per_token_is_known() -> None:
    # the trial's case: a warm-up of one-token requests taught a 50 ms lease; a 40-token
    # stream then held the slot ~2 s while the wait was predicted from the 50 ms
    _, pool, runtime, endpoint, clock = cold_pool()
    outlook = WaitOutlook(pool)
    outlook.observe_lease(endpoint, 0.05)
    assert endpoint.itl.ms is None, "one-token requests teach no time per token"
    pool.begin(runtime, endpoint, completion_tokens=40)
    view = outlook.view(runtime, 10, clock())
    assert view is not None
    priced = endpoint.predictor.predict_ms(0) + 40 * endpoint.itl.prior_ms
    assert view.remaining_ms == [priced] and priced > 50.0
    endpoint.itl.observe(0.5)  # once the endpoint's streams say how fast it is, that decides
    view = outlook.view(runtime, 10, clock())
    assert view is not None and view.remaining_ms == [endpoint.predictor.predict_ms(0) + 40 * 0.5]


def test_a_slot_of_unknown_length_on_a_cold_pool_is_priced_at_the_waiting_requests_own_completion() -> None:
    _, pool, runtime, endpoint, clock = cold_pool()
    outlook = WaitOutlook(pool)
    pool.begin(runtime, endpoint)  # sent without a known length
    own = outlook.view(runtime, 10, clock(), completion_tokens=100)
    default = outlook.view(runtime, 10, clock())
    assert own is not None and default is not None
    ttft_ms, itl_ms = endpoint.predictor.predict_ms(0), endpoint.itl.prior_ms
    assert outlook.predict_ms(own, ahead=0) == ttft_ms + 100 * itl_ms
    assert outlook.predict_ms(default, ahead=0) == ttft_ms + 256 * itl_ms


def test_a_request_with_a_small_max_tokens_waits_for_a_cold_pools_slot_held_by_one_like_it() -> None:
    # the trial's case: "pool wait 5320ms > 2996ms left" for max_tokens 100 (256 tokens at 20 ms)
    queued, pool, runtime, endpoint, clock = cold_pool()
    holder, router = queued.admission, queued.router
    lease = pool.begin(runtime, endpoint, completion_tokens=100)

    async def main() -> None:
        decision = router.decide(BODY, {"x-latency-budget-ms": "3000"})
        ask = Ask(DEFAULT, "k", clock(), decision.prompt_tokens + 100)
        held = asyncio.ensure_future(holder.hold(decision, ask))
        await asyncio.sleep(0)
        assert not held.done(), "a slot priced at 100 tokens frees within the budget: it waits"
        pool.end(runtime, endpoint, lease)
        after, _ = await held
        assert after.reason == "waited:vllm"

    asyncio.run(main())


def test_expected_hold_is_the_rest_of_the_lease_then_the_overrun_so_far() -> None:
    assert expected_hold_ms(700.0, 200.0) == 500.0
    assert expected_hold_ms(700.0, 700.0) == 0.0
    assert expected_hold_ms(700.0, 1500.0) == 800.0


def test_a_slot_held_past_its_lease_is_expected_to_free_after_one_still_within_its_lease() -> None:
    # a slowed endpoint's request outlived its lease: waiting on it as if it freed now is
    # how a waiter spends its budget's slack for nothing
    _, pool, runtime, endpoint, clock = cold_pool(POOL.replace("max_batch_size = 1", "max_batch_size = 2"))
    outlook = WaitOutlook(pool)
    endpoint.itl.observe(20.0)
    outlook.observe_lease(endpoint, 0.7)  # warm: no capacity floor
    lease_ms = endpoint.predictor.predict_ms(0) + 32 * 20.0
    pool.begin(runtime, endpoint, completion_tokens=32)  # sent at 0
    clock.now = (lease_ms + 1000.0) / 1000.0  # 1 s past its lease
    pool.begin(runtime, endpoint, completion_tokens=32)  # sent now
    view = outlook.view(runtime, 10, clock())
    assert view is not None and not view.cold
    assert outlook.predict_ms(view, ahead=0) == lease_ms, "the fresh one's slot frees first"
    assert abs(outlook.predict_ms(view, ahead=1) - 1000.0) < 1e-6, "1 s overrun: as long again"
