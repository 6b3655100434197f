"""The gateway queue's policy on plain data: order, fair shares, bounds, preemption,
the wait prediction and its correction, priority classes and the retry budget."""

from __future__ import annotations

import math

import pytest
from clocks import ManualClock

from latgate.foundation.errors import InvalidRequest
from latgate.routing.policies.retry_budget import hedge_suppressed, within_budget
from latgate.routing.priority import BATCH, DEFAULT, INTERACTIVE, effective_priority, priority_header
from latgate.routing.queue import Waiter, WaitQueue, choose_preemption, correction, predicted_wait_ms


def waiter(clock: ManualClock, priority: int = DEFAULT, *, tenant: str = "a", tokens: int = 100, wait_s: float = 10.0) -> Waiter:
    return Waiter(priority=priority, deadline=clock() + wait_s, tenant=tenant, cost_tokens=tokens, enqueued_at=clock())


def drain(queue: WaitQueue) -> list[Waiter]:
    out = []
    while (next_one := queue.pop()) is not None:
        out.append(next_one)
    return out


def test_a_higher_class_goes_first_whatever_it_arrived_after() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=10)
    batch = [waiter(clock, BATCH) for _ in range(3)]
    for w in batch:
        queue.push(w)
        clock.now += 1
    interactive = waiter(clock, INTERACTIVE)
    default = waiter(clock, DEFAULT)
    queue.push(default)
    queue.push(interactive)
    assert drain(queue) == [interactive, default, *batch]


def test_inside_a_class_and_a_tenant_the_earliest_deadline_goes_first() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=10)
    late = waiter(clock, wait_s=30.0)
    soon = waiter(clock, wait_s=0.5)
    queue.push(late)
    queue.push(soon)
    assert drain(queue) == [soon, late]


def test_a_flooding_key_does_not_starve_a_quiet_one_in_its_class() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=100)
    flood = [waiter(clock, BATCH, tenant="flood", tokens=500) for _ in range(20)]
    for w in flood:
        queue.push(w)
    quiet = [waiter(clock, BATCH, tenant="quiet", tokens=500) for _ in range(2)]
    for w in quiet:
        queue.push(w)
    order = drain(queue)
    assert order.index(quiet[0]) <= 1 and order.index(quiet[1]) <= 3, "the quiet key's turns alternate with the flood's"


def test_fair_shares_are_counted_in_tokens_not_requests() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=100)
    for _ in range(4):
        queue.push(waiter(clock, tenant="big", tokens=4000))
        queue.push(waiter(clock, tenant="small", tokens=1000))
    first_five = [w.tenant for w in drain(queue)[:5]]
    assert first_five.count("small") == 4, "four small requests cost what one big one does"


def test_a_key_that_was_idle_earns_no_credit_to_flood_later() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=100)
    for _ in range(10):
        queue.push(waiter(clock, tenant="busy", tokens=100))
    drain(queue)  # "busy" attained 1000 tokens; "late" none
    queue.push(waiter(clock, tenant="busy", tokens=100))
    late = [waiter(clock, tenant="late", tokens=100) for _ in range(5)]
    for w in late:
        queue.push(w)
    order = [w.tenant for w in drain(queue)]
    assert order.index("busy") <= 1, "the newcomer starts at the waiting tenants' level, not at 0"


def test_a_full_queue_sheds_its_newest_lowest_class_waiter_for_a_higher_class() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=2)
    older, newer = waiter(clock, BATCH), waiter(clock, BATCH)
    assert queue.push(older) is None and queue.push(newer) is None
    another_batch = waiter(clock, BATCH)
    assert queue.push(another_batch) is another_batch, "no room and nobody lower: the newcomer is refused"
    interactive = waiter(clock, INTERACTIVE)
    assert queue.push(interactive) is newer
    assert drain(queue) == [interactive, older]


def test_waiters_past_their_deadline_expire() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=10)
    short, long = waiter(clock, wait_s=1.0), waiter(clock, wait_s=5.0)
    queue.push(short)
    queue.push(long)
    clock.now += 2.0
    assert queue.expired(clock()) == [short] and queue.waiting == [long]
    assert queue.ahead_of(BATCH) == 1 and queue.ahead_of(INTERACTIVE) == 0


def test_the_predicted_wait_is_the_slot_that_frees_for_each_one_ahead_then_whole_leases() -> None:
    assert predicted_wait_ms([300.0, 40.0], ahead=0) == 40.0
    assert predicted_wait_ms([300.0, 40.0], ahead=1) == 300.0
    assert math.isinf(predicted_wait_ms([300.0, 40.0], ahead=2)), "no second round without a lease time"
    assert predicted_wait_ms([300.0, 40.0], ahead=2, lease_ms=360.0) == 400.0
    assert math.isinf(predicted_wait_ms([], ahead=0))


def test_the_wait_correction_follows_outcomes_and_never_makes_the_prediction_optimistic() -> None:
    ratio = correction(None, actual_ms=300.0, predicted_ms=100.0)
    assert ratio == 3.0, "the first outcome is taken as it is"
    assert correction(ratio, actual_ms=50.0, predicted_ms=100.0) < ratio
    assert correction(None, actual_ms=10.0, predicted_ms=100.0) == 1.0, "at least 1"
    assert correction(None, actual_ms=10_000.0, predicted_ms=1.0) == 4.0, "at most 4"
    assert correction(2.0, actual_ms=10.0, predicted_ms=math.inf) == 2.0


def test_preemption_takes_the_youngest_attempt_of_the_tenant_holding_the_most() -> None:
    running = [("flood", 1.0), ("quiet", 3.0), ("flood", 2.0), ("flood", 0.5)]
    assert choose_preemption(running, priority=INTERACTIVE, tenant="quiet", backlogged=()) == 2, "flood's newest"
    assert choose_preemption([("quiet", 3.0)], priority=DEFAULT, tenant="quiet", backlogged=()) == 0
    assert choose_preemption([], priority=INTERACTIVE, tenant="quiet", backlogged=()) is None


def test_a_batch_request_preempts_only_another_tenants_attempt_and_only_of_a_tenant_with_a_backlog() -> None:
    running = [("flood", 1.0), ("quiet", 3.0), ("flood", 2.0)]
    assert choose_preemption(running, priority=BATCH, tenant="quiet", backlogged={"flood"}) == 2
    assert choose_preemption(running, priority=BATCH, tenant="quiet", backlogged=()) is None, "no backlog: its slots are its share"
    assert choose_preemption(running, priority=BATCH, tenant="flood", backlogged={"flood", "quiet"}) == 1
    assert choose_preemption([("quiet", 3.0)], priority=BATCH, tenant="quiet", backlogged={"quiet"}) is None, "never its own"


def test_a_tenant_is_within_its_share_until_its_charged_slots_outrun_the_virtual_time() -> None:
    queue = WaitQueue(max_waiting=10)
    assert queue.within_share(BATCH, "quiet"), "a newcomer is owed its share"
    queue.charge(Waiter(priority=BATCH, deadline=9.0, tenant="quiet", cost_tokens=100, enqueued_at=0.0))
    assert not queue.within_share(BATCH, "quiet"), "one slot taken: 100 tokens ahead of the virtual time"
    for _ in range(3):
        queue.push(Waiter(priority=BATCH, deadline=9.0, tenant="flood", cost_tokens=60, enqueued_at=0.0))
    assert queue.backlogged(BATCH) == {"flood"} and queue.waiting_of(BATCH, "flood") == 3
    queue.pop()  # flood's first share: 0..60
    queue.pop()  # its second: 60..120, the virtual time at 60
    assert not queue.within_share(BATCH, "quiet")
    queue.pop()  # the virtual time at 120: the flood was served as much as the quiet key
    assert queue.within_share(BATCH, "quiet")
    assert not WaitQueue(max_waiting=1, waiting=[Waiter(BATCH, 9.0, "quiet", 1, 0.0)]).within_share(BATCH, "quiet"), (
        "a tenant with a waiter of its own has a backlog"
    )


@pytest.mark.parametrize(
    ("value", "expected"), [("interactive", INTERACTIVE), (" Batch ", BATCH), ("1", DEFAULT), ("", None), (None, None)]
)
def test_the_priority_header_takes_a_class_name_or_number(value, expected) -> None:
    assert priority_header(value) == expected


def test_a_priority_header_that_means_nothing_is_a_400_naming_it() -> None:
    with pytest.raises(InvalidRequest) as raised:
        priority_header("urgent")
    assert raised.value.param == "X-Latgate-Priority" and "'urgent'" in raised.value.message


def test_a_keys_ceiling_caps_the_class_it_may_claim_over_every_other_rule() -> None:
    claim = {"policy": None, "has_budget": False, "latency_sensitive": False}
    assert effective_priority(claimed=INTERACTIVE, ceiling="default", **claim) == DEFAULT
    assert effective_priority(claimed=INTERACTIVE, ceiling=None, **claim) == INTERACTIVE
    assert effective_priority(claimed=None, ceiling=None, **{**claim, "policy": "batch"}) == BATCH
    assert effective_priority(claimed=BATCH, ceiling=None, **{**claim, "has_budget": True}) == DEFAULT, "a budget: at least default"
    assert effective_priority(claimed=None, ceiling="batch", **{**claim, "has_budget": True}) == BATCH


def test_retries_and_hedges_stay_within_their_share_of_active_requests_with_a_floor() -> None:
    assert within_budget(extra_in_flight=1, active=10, percent=20.0, floor=0)
    assert not within_budget(extra_in_flight=2, active=10, percent=20.0, floor=0)
    assert within_budget(extra_in_flight=2, active=1, percent=20.0, floor=3), "a quiet provider can still retry"
    assert not within_budget(extra_in_flight=3, active=1, percent=20.0, floor=3)


def test_hedges_are_suppressed_when_most_endpoints_are_slow_at_once() -> None:
    assert hedge_suppressed([True, True, False])
    assert not hedge_suppressed([True, False, False])
    assert not hedge_suppressed([True]), "one endpoint: the copy goes elsewhere"


def test_the_access_line_gives_the_class_the_wait_and_the_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    import orjson

    from latgate.forwarding.exchange import Exchange
    from latgate.forwarding.recorder import Recorder
    from latgate.foundation.logs import access_log
    from latgate.foundation.metrics import Metrics

    lines: list[str] = []
    monkeypatch.setattr(access_log, "enabled", lambda: True)
    monkeypatch.setattr(access_log, "write", lines.append)
    shed = Exchange(request_id="r1", received_at=0.0, path="/v1/chat/completions", stream=False, status=503)
    shed.priority, shed.queue_outcome = BATCH, "shed"
    waited = Exchange(request_id="r2", received_at=0.0, path="/v1/chat/completions", stream=False, status=200)
    waited.priority, waited.queue_ms, waited.queue_outcome = INTERACTIVE, 12.34567, "admitted"
    plain = Exchange(request_id="r3", received_at=0.0, path="/v1/chat/completions", stream=False, status=200)
    for exchange in (shed, waited, plain):
        Recorder(metrics=Metrics(providers=[], models=[])).finish(exchange, now=1.0)
    first, second, third = (orjson.loads(line) for line in lines)
    assert (first["priority"], first["queue_ms"], first["queue_outcome"]) == ("batch", None, "shed")
    assert (second["priority"], second["queue_ms"], second["queue_outcome"]) == ("interactive", 12.346, "admitted")
    assert "queue_outcome" not in third, "a request that met no full pool: no wait or outcome"
    assert third["priority"] == "default", "every line gives the class"


def test_a_keys_interactive_turns_do_not_push_back_its_batch_jobs_share() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=20)
    for _ in range(3):  # the quiet key's interactive turns, served first (their own class)
        queue.push(waiter(clock, INTERACTIVE, tenant="quiet", tokens=1000))
    floods = [queue.push(waiter(clock, BATCH, tenant="flood", tokens=100)) for _ in range(3)]
    assert floods == [None] * 3
    quiet_batch = waiter(clock, BATCH, tenant="quiet", tokens=100)
    queue.push(quiet_batch)
    order = drain(queue)
    batch_order = [w.tenant for w in order if w.priority == BATCH]
    assert batch_order.index("quiet") <= 1, f"the quiet key's batch job goes among the first: {batch_order}"


def test_the_expected_completion_is_a_median_per_tenant_capped_by_the_requests_own_cap() -> None:
    from latgate.routing.policies.completion_length import MIN_OWN_STREAMS, CompletionLengths

    lengths = CompletionLengths()
    for _ in range(20):
        lengths.observe(40, priority=INTERACTIVE, tenant="quiet")
    for _ in range(MIN_OWN_STREAMS):  # one client's very long streams
        lengths.observe(100_000, priority=BATCH, tenant="poison")
    assert lengths.expected(priority=INTERACTIVE, tenant="quiet") == 40.0, "the quiet key's own streams"
    assert lengths.expected(priority=INTERACTIVE, tenant="new") == 40.0, "its class's, untouched by batch"
    assert lengths.pool_median == 40.0, "a minority of outliers does not move the pool's median"
    assert lengths.expected(priority=BATCH, tenant="poison") == 100_000.0, "the poisoner's own estimate only"
    assert lengths.expected(priority=BATCH, tenant="poison", cap=64) == 64.0, "never beyond the request's cap"
    assert CompletionLengths().expected(priority=BATCH, cap=16) == 16.0
    assert CompletionLengths().expected(priority=BATCH) is None


def test_retry_after_is_the_predicted_wait_rounded_up_and_bounded() -> None:
    from latgate.routing.queue_outlook import MAX_RETRY_AFTER_SECONDS, retry_after_seconds

    assert retry_after_seconds(2_900.0) == 3
    assert retry_after_seconds(10.0) == 1
    assert retry_after_seconds(10_000_000.0) == MAX_RETRY_AFTER_SECONDS
    assert retry_after_seconds(math.inf) == 1


def test_a_quiet_tenants_newcomer_stands_before_a_floods_backlog() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=100)
    for _ in range(20):
        queue.push(waiter(clock, BATCH, tenant="flood"))
    assert queue.ahead_of(BATCH, "flood") == 20, "the flood's next one waits behind its own backlog"
    assert queue.ahead_of(BATCH, "quiet") <= 1, "a quiet key's job is predicted near the front, as it is served"
    queue.push(waiter(clock, BATCH, tenant="quiet"))
    assert [w.tenant for w in drain(queue)].index("quiet") <= 1


def test_without_a_key_the_fair_share_is_the_clients_address_whatever_session_it_claims() -> None:
    from types import SimpleNamespace

    from latgate.foundation.config import load_config_text
    from latgate.request.gateway import Gateway, client_tenant
    from latgate.routing.decision import Router

    config = load_config_text('[providers.p]\napi_base = "http://127.0.0.1:9/v1"\nmodels = ["m"]\n', source="t.toml")
    router = Router(config)
    fake = SimpleNamespace(config=config)
    address = client_tenant(("10.0.0.7", 50123))
    tenants = set()
    for session in ("s-1", "s-2", "s-3"):  # a flooder minting a session per request
        decision = router.decide({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, {"x-session-id": session})
        tenants.add(Gateway._priority(fake, decision, {}, None, address)[1])  # type: ignore[arg-type]
    assert tenants == {"addr:10.0.0.7"}, "one share for one address"
    assert client_tenant(("10.0.0.7", 60000)) == address, "a new connection is not a new tenant"
    assert client_tenant(None) == ""


def test_a_newcomers_place_is_where_pop_serves_it_a_tight_deadline_before_its_own_tenants_loose_ones() -> None:
    clock = ManualClock()
    queue = WaitQueue(max_waiting=100)
    for tenant, wait_s in [("a", 30.0), ("a", 30.0), ("b", 30.0), ("a", 0.3), ("a", 30.0), ("b", 30.0), ("a", 30.0)]:
        queue.push(waiter(clock, tenant=tenant, wait_s=wait_s))
        clock.now += 0.01
    tight = waiter(clock, tenant="a", wait_s=0.4)  # a budgeted request behind its own client's ordinary ones
    ahead = queue.ahead_of(DEFAULT, "a", tight.deadline)
    queue.push(tight)
    served_before = [w for w in drain(queue)].index(tight)
    assert ahead == served_before == 2, "its tenant's earlier deadline and b's first share go first: a's 5 looser ones do not"
