"""Routing policies on plain data: each choice is a pure function of its snapshot."""

from __future__ import annotations

import collections
import random

from latgate.routing.policies.deadline import first_token_deadline_ms
from latgate.routing.policies.hedging import MIN_HEDGE_DELAY_MS, hedge_delay_ms
from latgate.routing.policies.least_outstanding import choose_least_outstanding
from latgate.routing.policies.outlier import too_slow
from latgate.routing.policies.overflow import choose_overflow
from latgate.routing.policies.predicted_ttft import choose_power_of_two
from latgate.routing.policies.rendezvous import endpoint_salt
from latgate.routing.policies.retry import AfterFailure, after_failure
from latgate.routing.policies.round_robin import choose_round_robin
from latgate.routing.policies.view import EndpointView as V


def turns(views: list[V], count: int) -> list[int]:
    credit: list[float] = []
    chosen = []
    for _ in range(count):
        index, credit = choose_round_robin(views, credit=credit)
        chosen.append(index)
    return chosen


def test_round_robin_takes_endpoints_in_turn() -> None:
    assert turns([V(), V(), V()], 6) == [0, 1, 2, 0, 1, 2]


def test_round_robin_skips_an_endpoint_that_cannot_take_traffic() -> None:
    assert turns([V(), V(available=False), V()], 4) == [0, 2, 0, 2]


def test_round_robin_uses_an_ejected_endpoint_when_none_is_left() -> None:
    assert turns([V(available=False), V(available=False)], 3) == [0, 1, 0]


def test_round_robin_gives_each_weight_its_share_interleaved() -> None:
    assert turns([V(weight=5), V(), V()], 7) == [0, 0, 1, 0, 2, 0, 0]  # nginx's own example: a a b a c a a
    assert turns([V(weight=0.5), V(weight=1.5)], 4) == [1, 0, 1, 1]


def test_round_robin_starts_afresh_when_the_endpoints_change() -> None:
    _, credit = choose_round_robin([V(), V()], credit=[])
    assert choose_round_robin([V(), V(), V()], credit=credit)[0] == 0


def test_least_outstanding_takes_the_endpoint_with_fewest_in_flight() -> None:
    assert choose_least_outstanding([V(in_flight=4), V(in_flight=1), V(in_flight=2)], turn=0) == 1


def test_least_outstanding_rotates_among_equals() -> None:
    views = [V(in_flight=1), V(in_flight=1)]
    assert [choose_least_outstanding(views, turn=t) for t in range(4)] == [0, 1, 0, 1]


def test_least_outstanding_ignores_an_idle_but_ejected_endpoint() -> None:
    assert choose_least_outstanding([V(in_flight=0, available=False), V(in_flight=9)], turn=0) == 1


def test_power_of_two_takes_the_lower_predicted_ttft() -> None:
    views = [V(predicted_ttft_ms=80.0), V(predicted_ttft_ms=20.0)]
    assert choose_power_of_two(views, draws=(0, 0)) == 1


def test_power_of_two_breaks_ties_by_fewer_in_flight() -> None:
    views = [V(predicted_ttft_ms=20.0, in_flight=3), V(predicted_ttft_ms=20.0, in_flight=1)]
    assert choose_power_of_two(views, draws=(0, 0)) == 1


def test_power_of_two_never_takes_an_ejected_endpoint_while_another_is_available() -> None:
    views = [V(predicted_ttft_ms=1.0, available=False), V(predicted_ttft_ms=900.0)]
    assert choose_power_of_two(views, draws=(0, 0)) == 1


def test_power_of_two_gives_a_half_open_endpoint_its_trial_first() -> None:
    views = [V(predicted_ttft_ms=10.0), V(predicted_ttft_ms=900.0, trial=True)]
    assert choose_power_of_two(views, draws=(0, 0)) == 1


def test_a_request_that_cannot_risk_a_trial_passes_a_half_open_endpoint_over() -> None:
    views = [V(predicted_ttft_ms=10.0, trial=True), V(predicted_ttft_ms=90.0)]
    assert choose_power_of_two(views, draws=(0, 0), trial_first=False) == 1
    assert choose_power_of_two([V(trial=True)], draws=(0, 0), trial_first=False) == 0, "unless it is the only one"


def test_power_of_two_compares_only_the_two_drawn() -> None:
    views = [
        V(predicted_ttft_ms=10.0),
        V(predicted_ttft_ms=500.0),
        V(predicted_ttft_ms=30.0),
        V(predicted_ttft_ms=200.0),
    ]
    assert choose_power_of_two(views, draws=(1, 2)) == 3  # the pair is (1, 3)
    assert choose_power_of_two(views, draws=(0, 0)) == 0  # the pair is (0, 1)


def test_power_of_two_spreads_a_burst_instead_of_herding_on_the_best() -> None:
    rng = random.Random(7)
    views = [V(predicted_ttft_ms=10.0 * 2**i) for i in range(8)]
    picks = collections.Counter(
        choose_power_of_two(views, draws=(rng.getrandbits(30), rng.getrandbits(30))) for _ in range(800)
    )
    assert len(picks) == 7  # every endpoint but the slowest gets some
    assert picks[0] < 300


def test_equal_endpoints_give_one_session_the_same_endpoint_and_spread_sessions() -> None:
    views = [V(salt=endpoint_salt(f"p-{i}")) for i in range(4)]
    assert len({choose_power_of_two(views, draws=(n, n + 1), compare_all=True, identity=7, turn=n) for n in range(8)}) == 1
    chosen = {choose_power_of_two(views, draws=(0, 1), compare_all=True, identity=n) for n in range(40)}
    assert chosen == {0, 1, 2, 3}


def test_the_session_s_endpoint_wins_between_equals_but_not_over_less_load() -> None:
    views = [V(salt=endpoint_salt(f"p-{i}")) for i in range(2)]
    other = 1 - choose_power_of_two(views, draws=(0, 0), identity=7)
    assert choose_power_of_two(views, draws=(0, 0), identity=7, home=other) == other
    views[other].in_flight = 1
    assert choose_power_of_two(views, draws=(0, 0), identity=7, home=other) == 1 - other


def test_rendezvous_skips_an_ejected_endpoint() -> None:
    views = [V(salt=endpoint_salt("p-0")), V(salt=endpoint_salt("p-1"))]
    home = choose_power_of_two(views, draws=(0, 0), identity=3)
    views[home].available = False
    assert choose_power_of_two(views, draws=(0, 0), identity=3) == 1 - home


def overflow(ttft: list[float], e2e: list[float] | None = None, **options: object) -> int:
    return choose_overflow(ttft, e2e_ms=ttft if e2e is None else e2e, budget_ms=200, **options)


def test_overflow_keeps_the_preferred_provider_while_it_meets_the_budget() -> None:
    assert overflow([190.0, 40.0]) == 0
    assert overflow([190.0, 40.0], [5000.0, 300.0]) == 0, "a rule is left only on evidence of a TTFT miss"


def test_overflow_moves_to_the_candidate_most_likely_to_meet_the_budget() -> None:
    assert overflow([450.0, 900.0, 60.0, 80.0]) == 2


def test_overflow_takes_the_best_when_none_can_meet_the_budget() -> None:
    assert overflow([450.0, 900.0, 300.0]) == 2
    assert overflow([250.0, 900.0, 300.0]) == 0


def test_overflow_leaves_a_provider_that_cannot_take_traffic() -> None:
    assert overflow([float("inf"), 900.0]) == 1


def test_overflow_prefers_the_faster_finish_among_candidates_meeting_the_budget() -> None:
    # a fast-TTFT, slow-decode throughput pool (index 1) and a fast-decode pool (index 2)
    assert overflow([450.0, 40.0, 90.0], [900.0, 5630.0, 727.0]) == 2
    assert overflow([450.0, 40.0, 260.0], [900.0, 5630.0, 727.0]) == 1, "the TTFT budget decides who may take it"
    assert overflow([450.0, 260.0, 300.0], [900.0, 5630.0, 727.0]) == 1, "none meets it: the nearest TTFT"


def test_overflow_after_admission_left_the_rule_compares_every_candidate() -> None:
    # keep_preferred=False: index 0 is the first fallback, not a rule to keep
    assert overflow([40.0, 90.0], [5630.0, 727.0], keep_preferred=False) == 1
    assert overflow([40.0, 90.0], [700.0, 727.0], keep_preferred=False) == 0
    assert overflow([40.0, float("inf")], [5630.0, float("inf")], keep_preferred=False) == 0


def test_hedge_waits_for_the_p90_when_the_budget_allows() -> None:
    assert hedge_delay_ms(p90_ttft_ms=80.0, hedge_ttft_ms=60.0, budget_ms=200) == 80.0


def test_hedge_waits_for_a_quarter_of_the_budget_at_least() -> None:
    assert hedge_delay_ms(p90_ttft_ms=12.0, hedge_ttft_ms=60.0, budget_ms=200) == 50.0


def test_hedge_fires_early_enough_for_the_copy_to_meet_the_budget() -> None:
    assert hedge_delay_ms(p90_ttft_ms=150.0, hedge_ttft_ms=60.0, budget_ms=200) == 140.0


def test_hedge_never_fires_at_once() -> None:
    assert hedge_delay_ms(p90_ttft_ms=150.0, hedge_ttft_ms=400.0, budget_ms=200) == MIN_HEDGE_DELAY_MS
    assert hedge_delay_ms(p90_ttft_ms=80.0, hedge_ttft_ms=10.0, budget_ms=None) == 80.0


def test_deadline_is_the_budget_when_something_is_left_to_try() -> None:
    assert (
        first_token_deadline_ms(budget_ms=200, predicted_ttft_ms=30.0, configured_ms=None, last_attempt=False)
        == 200.0
    )


def test_deadline_leaves_a_slow_prediction_twice_its_time() -> None:
    assert (
        first_token_deadline_ms(
            budget_ms=200, predicted_ttft_ms=400.0, configured_ms=None, last_attempt=False
        )
        == 800.0
    )


def test_deadline_never_cuts_the_last_attempt_short() -> None:
    assert (
        first_token_deadline_ms(budget_ms=200, predicted_ttft_ms=30.0, configured_ms=None, last_attempt=True)
        is None
    )
    assert (
        first_token_deadline_ms(
            budget_ms=200, predicted_ttft_ms=30.0, configured_ms=5000.0, last_attempt=True
        )
        == 5000.0
    )


def test_deadline_without_a_budget_is_the_configured_one() -> None:
    assert (
        first_token_deadline_ms(
            budget_ms=None, predicted_ttft_ms=30.0, configured_ms=1000.0, last_attempt=False
        )
        == 1000.0
    )
    assert (
        first_token_deadline_ms(
            budget_ms=200, predicted_ttft_ms=30.0, configured_ms=100.0, last_attempt=False
        )
        == 100.0
    )


def test_an_endpoint_far_slower_than_its_peers_is_too_slow() -> None:
    assert too_slow(400.0, [20.0, 25.0, 400.0], factor=3.0, margin_ms=50.0)
    assert not too_slow(100.0, [20.0, 25.0], factor=3.0, margin_ms=50.0)
    assert not too_slow(400.0, [], factor=3.0, margin_ms=50.0)


def _after(**given: object) -> AfterFailure:
    facts = {"retryable": True, "busy": False, "client_mistake": False, "retry_after_seconds": None,
             "retries_done": 0, "max_retries": 3}  # fmt: skip
    return after_failure(**{**facts, **given})  # type: ignore[arg-type]


def test_a_retryable_failure_is_retried_after_a_doubling_capped_back_off() -> None:
    assert [_after(retries_done=n, max_retries=9).delay_seconds for n in range(6)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert all(_after(retries_done=n, max_retries=9).retry for n in range(6))


def test_an_upstream_retry_after_is_waited_for_up_to_five_seconds_then_the_fallbacks_go_first() -> None:
    assert _after(retry_after_seconds=2.5) == AfterFailure(retry=True, delay_seconds=2.5)
    assert _after(retry_after_seconds=5.0) == AfterFailure(retry=True, delay_seconds=5.0)
    assert _after(retry_after_seconds=5.5) == AfterFailure(retry=False)


def test_no_retry_when_retries_are_spent_the_failure_is_not_retryable_or_the_provider_is_full() -> None:
    assert _after(retries_done=3) == AfterFailure(retry=False)
    assert _after(retryable=False) == AfterFailure(retry=False)
    assert _after(busy=True, retry_after_seconds=0.1) == AfterFailure(retry=False)


def test_the_clients_own_mistake_stops_without_trying_another_provider() -> None:
    assert _after(retryable=False, client_mistake=True) == AfterFailure(retry=False, next_provider=False)
    assert _after(retries_done=3, client_mistake=True).next_provider is False



def test_refused_stream_options_go_again_at_once_to_the_same_endpoint_without_them_whatever_retries_are_left() -> None:
    # a 400 naming the field: not retryable, the client's mistake on its face, no retries left
    refused = {"retryable": False, "client_mistake": True, "stream_options_refused": True}
    again = AfterFailure(retry=True, delay_seconds=0.0, without_stream_options=True)
    assert _after(**refused) == again
    assert _after(**refused, retries_done=3, max_retries=3) == again
    assert _after(**refused, max_retries=0) == again
    assert _after(retryable=False, client_mistake=True) == AfterFailure(retry=False, next_provider=False)
