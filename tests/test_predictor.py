"""The TTFT predictor and the live numbers of an endpoint (plain data, no I/O)."""

from __future__ import annotations

import pytest

from latgate.foundation.config import load_config_text
from latgate.foundation.config.schema import HealthConfig
from latgate.live.providers.endpoint import EndpointRuntime
from latgate.live.providers.health import CircuitBreaker, MemoryCircuitStore
from latgate.live.providers.predictor import TtftPredictor


def endpoint(
    config_text: str = '[providers.p]\napi_base = "http://h:1"\nmax_batch_size = 8\n',
) -> EndpointRuntime:
    config = load_config_text(config_text, source="test.toml")
    provider = next(iter(config.providers.values()))
    breaker = CircuitBreaker(settings=HealthConfig(), store=MemoryCircuitStore(), clock=lambda: 0.0)
    return EndpointRuntime.for_provider(provider, provider.endpoints[0], breaker=breaker)


def test_before_any_request_the_prediction_is_the_prior_line() -> None:
    predictor = TtftPredictor(prior_base_ms=50.0, prior_per_token_ms=0.05)
    assert predictor.predict_ms(1000) == pytest.approx(100.0)


def test_the_first_request_replaces_the_prior_level() -> None:
    predictor = TtftPredictor(prior_base_ms=500.0, prior_per_token_ms=0.05)
    predictor.observe(prompt_tokens=400, ttft_ms=40.0)
    assert predictor.predict_ms(400) == pytest.approx(40.0, rel=0.02)


def test_predictor_follows_a_step_change_within_about_20_requests() -> None:
    predictor = TtftPredictor(prior_base_ms=50.0, prior_per_token_ms=0.05)
    for _ in range(100):
        predictor.observe(prompt_tokens=500, ttft_ms=40.0)
    for count in range(1, 21):
        predictor.observe(prompt_tokens=500, ttft_ms=300.0)
        if count == 5:
            assert predictor.predict_ms(500) > 150.0, "half-way there after 5 requests"
    assert predictor.predict_ms(500) == pytest.approx(300.0, rel=0.05)


def test_predictor_follows_a_step_down_as_fast() -> None:
    predictor = TtftPredictor(prior_base_ms=50.0, prior_per_token_ms=0.05)
    for _ in range(100):
        predictor.observe(prompt_tokens=500, ttft_ms=300.0)
    for _ in range(20):
        predictor.observe(prompt_tokens=500, ttft_ms=40.0)
    assert predictor.predict_ms(500) == pytest.approx(40.0, rel=0.3)


def test_slope_is_fitted_from_prompts_of_different_lengths() -> None:
    predictor = TtftPredictor(prior_base_ms=50.0, prior_per_token_ms=0.0)
    for _ in range(30):
        for tokens in (100, 2000, 8000):
            predictor.observe(prompt_tokens=tokens, ttft_ms=10.0 + 0.1 * tokens)
    assert predictor.predict_ms(4000) == pytest.approx(410.0, rel=0.05)
    assert predictor.predict_ms(0) == pytest.approx(
        10.0, abs=10.0
    )  # the slope is shrunk a little towards the prior


def test_prompts_of_one_size_are_predicted_exactly_at_that_size() -> None:
    predictor = TtftPredictor(prior_base_ms=50.0, prior_per_token_ms=0.05)
    for _ in range(30):
        predictor.observe(prompt_tokens=1000, ttft_ms=80.0)
    assert predictor.predict_ms(1000) == pytest.approx(80.0, rel=0.01)
    assert 0.0 <= predictor.per_token_ms <= 0.05


def test_an_upstream_seen_only_with_long_prompts_keeps_its_prior_intercept() -> None:
    predictor = TtftPredictor(prior_base_ms=500.0, prior_per_token_ms=0.05)
    for _ in range(30):
        predictor.observe(prompt_tokens=20_000, ttft_ms=600.0)
    assert predictor.predict_ms(20_000) == pytest.approx(600.0, rel=0.01)
    assert predictor.predict_ms(500) > 400.0, "not a line through the origin"


def test_short_prompts_are_never_predicted_free() -> None:
    predictor = TtftPredictor(prior_base_ms=50.0, prior_per_token_ms=0.05)
    for _ in range(10):
        predictor.observe(prompt_tokens=4000, ttft_ms=20.0)  # faster than the prior slope allows
    assert predictor.base_ms >= 0.0 and predictor.predict_ms(10) > 0.0


def test_a_censored_observation_counts_only_when_later_than_predicted() -> None:
    predictor = TtftPredictor(prior_base_ms=50.0, prior_per_token_ms=0.0)
    predictor.observe(prompt_tokens=100, ttft_ms=50.0)
    predictor.observe_at_least(prompt_tokens=100, ttft_ms=20.0)
    assert predictor.predict_ms(100) == pytest.approx(50.0) and predictor.observations == 1
    predictor.observe_at_least(prompt_tokens=100, ttft_ms=500.0)
    assert predictor.predict_ms(100) > 100.0


def test_p90_lies_above_the_prediction_by_the_recent_error() -> None:
    predictor = TtftPredictor(prior_base_ms=50.0, prior_per_token_ms=0.0)
    for value in [40.0, 60.0] * 20:
        predictor.observe(prompt_tokens=100, ttft_ms=value)
    assert predictor.predict_ms(100) == pytest.approx(50.0, abs=3.0)
    assert 60.0 < predictor.p90_ms(100) < 80.0


def test_a_full_endpoint_adds_the_wait_for_a_batch_slot() -> None:
    ep = endpoint()
    ep.slot_seconds = 0.4
    ep.in_flight = 7
    assert ep.queue_ms(now=0.0) == 0.0
    ep.in_flight = 12  # 8 running, 4 waiting: this one waits for 5 to leave, at 8 per 0.4 s
    assert ep.queue_ms(now=0.0) == pytest.approx(5 * 400.0 / 8)
    assert ep.predicted_ttft_ms(100, now=0.0) == pytest.approx(250.0 + ep.predictor.predict_ms(100))


def test_engine_gauges_add_other_clients_load_while_they_are_recent() -> None:
    ep = endpoint()
    ep.slot_seconds = 0.8
    ep.in_flight = 2
    ep.observe_engine(running=8, waiting=3, now=10.0)  # 9 requests are someone else's
    assert ep.load(now=11.0) == 11
    assert ep.queue_ms(now=11.0) == pytest.approx(4 * 800.0 / 8)
    assert ep.load(now=100.0) == 2, "stale gauges are ignored"


def test_capacity_is_inferred_from_engine_gauges_when_the_config_has_none() -> None:
    ep = endpoint('[providers.p]\napi_base = "http://h:1"\n')
    ep.in_flight = 40
    assert ep.queue_ms(now=0.0) == 0.0, "no known capacity: no queue term"
    ep.observe_engine(running=16, waiting=24, now=0.0)
    assert ep.inferred_capacity == 16 and ep.queue_ms(now=0.0) > 0.0


def test_capacity_comes_from_engine_hints_too() -> None:
    ep = endpoint('[providers.p]\napi_base = "http://h:1"\nmax_num_seqs = 32\n')
    assert ep.capacity == 32


def test_decode_pool_starts_with_a_faster_prior_than_a_hosted_upstream() -> None:
    decode = endpoint('[providers.p]\napi_base = "http://h:1"\nrole = "decode"\n')
    hosted = endpoint('[providers.p]\napi_base = "http://h:1"\nrole = "upstream"\n')
    assert decode.predicted_ttft_ms(500, now=0.0) < hosted.predicted_ttft_ms(500, now=0.0)


def test_after_a_burst_the_wait_is_what_the_oldest_request_has_left() -> None:
    ep = endpoint()
    ep.slot_seconds = 0.8
    ep.leases = [(t, 0) for t in [10.0] * 8 + [10.1] * 2]  # a burst filled every slot at once; 2 wait
    ep.in_flight = 10
    # this request waits for the 3rd of the 8 running to leave: 0.7 s left at 10.1 s
    assert ep.queue_ms(now=10.1) == pytest.approx(700.0)
    ep.leases = [(t, 0) for t in (9.3, 9.4, 9.5, 9.6, 9.7, 9.8, 9.9, 10.0)]  # staggered: the oldest is nearly done
    ep.in_flight = 8
    assert ep.queue_ms(now=10.0) == pytest.approx(100.0)


def test_more_waiting_than_slots_adds_a_whole_round_per_turn() -> None:
    ep = endpoint()
    ep.slot_seconds = 0.5
    ep.leases = [(0.0, 0)] * 17
    ep.in_flight = 17
    assert ep.queue_ms(now=0.0) == pytest.approx(1000.0)  # 10 must leave: 8 at 0.5 s, then 2 more at 1 s


def test_a_request_routed_but_not_yet_sent_counts_as_load() -> None:
    ep = endpoint()
    ep.slot_seconds = 0.8
    ep.leases, ep.in_flight = [(10.0, 0)] * 8, 8
    assert ep.queue_ms(now=10.0) == pytest.approx(800.0)
    ep.pending = 8  # a burst routed in one go: the next one waits a whole further round
    assert ep.load(now=10.0) == 16
    assert ep.queue_ms(now=10.0) == pytest.approx(1600.0)
