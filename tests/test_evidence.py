"""Routing on evidence, on plain data: unknown is not slow, load counts between close
predictions, a rule is left only on evidence, ejection needs evidence and has a ceiling.

The policies are pure functions tested with literals; the selector tests drive a real
:class:`ProviderPool` and :class:`Selector` through the calls the forwarder makes, on an
injected clock, with each endpoint's TTFT given by the test."""

from __future__ import annotations

import collections
import random
from collections.abc import Callable

from clocks import ManualClock

from latgate.foundation.config import load_config_text
from latgate.foundation.metrics import Metrics
from latgate.live.providers import ProviderPool
from latgate.routing.decision import Router
from latgate.routing.policies.evidence import aged_estimate_ms, confidence, leave_evidence, stale
from latgate.routing.policies.outlier import LatencyEvidence, judge_outlier
from latgate.routing.policies.predicted_ttft import choose_power_of_two
from latgate.routing.policies.view import EndpointView as V
from latgate.routing.selection import Selector

# --- the policies on literals -------------------------------------------------------------


def test_confidence_grows_with_observations_and_fades_with_age() -> None:
    assert confidence(0.0, 0.0) == 0.0
    assert confidence(1.0, 0.0) < confidence(5.0, 0.0) < 1.0
    assert confidence(5.0, 120.0) < confidence(5.0, 0.0) / 2, "old evidence moves back to the prior"
    assert aged_estimate_ms(500.0, 20.0, 0.0) == 20.0 and aged_estimate_ms(500.0, 20.0, 1.0) == 500.0


def test_an_estimate_is_stale_when_thin_old_or_passed_over() -> None:
    assert stale(observations=0, age_s=0.0, routed_elsewhere=0)
    assert not stale(observations=9, age_s=1.0, routed_elsewhere=2)
    assert stale(observations=9, age_s=60.0, routed_elsewhere=0)
    assert stale(observations=9, age_s=1.0, routed_elsewhere=50)


def test_cold_an_unmeasured_endpoint_is_explored_when_not_busy() -> None:
    views = [V(predicted_ttft_ms=7.0, observations=9), V(predicted_ttft_ms=200.0, explore=True)]
    assert choose_power_of_two(views, draws=(0, 0), explore=True) == 1
    assert choose_power_of_two(views, draws=(0, 0), explore=False) == 0, "without leave to explore: the estimate"
    busy = [V(predicted_ttft_ms=7.0, observations=9), V(predicted_ttft_ms=200.0, explore=True, busy=True)]
    assert choose_power_of_two(busy, draws=(0, 0), explore=True) == 0


def test_identical_close_predictions_take_turns_and_load_decides() -> None:
    views = [V(predicted_ttft_ms=7.2), V(predicted_ttft_ms=7.9)]
    assert [choose_power_of_two(views, draws=(0, 0), turn=t) for t in range(4)] == [0, 1, 0, 1]
    loaded = [V(predicted_ttft_ms=7.0, others=6), V(predicted_ttft_ms=8.0)]
    assert choose_power_of_two(loaded, draws=(0, 0)) == 1, "the engine's running count is load"
    weighted = [V(predicted_ttft_ms=7.0, in_flight=2, weight=4.0), V(predicted_ttft_ms=7.0, in_flight=1)]
    assert choose_power_of_two(weighted, draws=(0, 0)) == 0, "load per unit of weight"


def test_a_cold_provider_is_no_evidence_to_leave_its_rule() -> None:
    cold = V(predicted_ttft_ms=200.0, p90_ttft_ms=280.0, observations=0)
    assert leave_evidence([cold], cold, budget_ms=200, queue_p90_ms=0.0) is None


def test_a_full_provider_is_capacity_evidence() -> None:
    full = V(predicted_ttft_ms=900.0, p90_ttft_ms=1900.0, observations=9, busy=True)
    assert leave_evidence([full], full, budget_ms=200, queue_p90_ms=1800.0) == "capacity"
    queued = V(predicted_ttft_ms=900.0, p90_ttft_ms=1900.0, observations=0)
    assert leave_evidence([queued], queued, budget_ms=200, queue_p90_ms=1800.0) == "capacity"
    patient = V(predicted_ttft_ms=900.0, p90_ttft_ms=1900.0, busy=True)
    assert leave_evidence([patient], patient, budget_ms=60_000, queue_p90_ms=1800.0) is None


def test_slow_with_evidence_is_a_predicted_miss_but_not_before_enough_observations() -> None:
    slow = V(predicted_ttft_ms=400.0, p90_ttft_ms=480.0, observations=9)
    assert leave_evidence([slow], slow, budget_ms=200, queue_p90_ms=0.0) == "predicted_miss"
    once = V(predicted_ttft_ms=400.0, p90_ttft_ms=480.0, observations=1)
    assert leave_evidence([once], once, budget_ms=200, queue_p90_ms=0.0) is None


FAST = LatencyEvidence(fitted_ms=20.0, measured_ms=22.0, observations=9)
SLOW = LatencyEvidence(fitted_ms=600.0, measured_ms=610.0, observations=9)
RULES = {"factor": 3.0, "margin_ms": 50.0, "min_observations": 5, "max_share": 0.5}


def test_an_outlier_with_evidence_is_ejected_and_the_verdict_names_its_numbers() -> None:
    verdict = judge_outlier(SLOW, [FAST, FAST, FAST], **RULES)
    assert verdict.eject and "610 ms measured" in verdict.evidence and "peers' median 22 ms" in verdict.evidence
    few = LatencyEvidence(fitted_ms=600.0, measured_ms=610.0, observations=2)
    assert not judge_outlier(few, [FAST, FAST], **RULES).eject


def test_overload_is_not_an_outlier() -> None:
    queued = LatencyEvidence(fitted_ms=600.0, measured_ms=900.0, observations=9, queued=True)
    assert not judge_outlier(queued, [FAST, FAST], **RULES).eject, "its own queue explains it"
    busy_peer = LatencyEvidence(fitted_ms=20.0, measured_ms=900.0, observations=9, queued=True)
    assert not judge_outlier(SLOW, [busy_peer, busy_peer], **RULES).eject, "every endpoint at capacity"


def test_a_queue_misestimate_cannot_make_a_healthy_endpoint_look_slow() -> None:
    # the small endpoint's queue was over-estimated: its fitted line fell to ~0 while its
    # measured TTFT is as long as everyone's
    small = LatencyEvidence(fitted_ms=0.2, measured_ms=1300.0, observations=30, capacity=2)
    healthy = LatencyEvidence(fitted_ms=1200.0, measured_ms=1250.0, observations=30, capacity=8)
    assert not judge_outlier(healthy, [small, healthy, healthy], **RULES).eject


def test_the_ejection_ceiling_keeps_capacity_in_service() -> None:
    out = LatencyEvidence(fitted_ms=20.0, measured_ms=22.0, observations=9, in_service=False)
    assert not judge_outlier(SLOW, [out, FAST], **RULES).eject, "one of three out already: the share is 1"
    assert not judge_outlier(SLOW, [out], **RULES).eject, "never the last endpoint in service"
    big = LatencyEvidence(fitted_ms=600.0, measured_ms=610.0, observations=9, capacity=8)
    small = LatencyEvidence(fitted_ms=20.0, measured_ms=22.0, observations=9, capacity=2)
    assert not judge_outlier(big, [small], **RULES).eject, "it holds most of the slots"
    assert judge_outlier(SLOW, [FAST], **RULES).eject, "one of two identical replicas may go"


# --- the selector over a live pool, as the forwarder drives it ------------------------------

CONFIG = """
[providers.decode]
endpoints = [{decode}]
role = "decode"
connector = "vllm"
models = ["m"]
[providers.vllm]
endpoints = [{vllm}]
connector = "vllm"
models = ["m"]
[routing]
default_route = "vllm"
latency_threshold_ms = 200
route_latency_sensitive_to = "decode"
"""


class Rig:
    """A pool, router and selector for CONFIG; ``send`` routes one request and reports
    its first token as ``ttft_ms(endpoint_id)`` says (or holds it in flight)."""

    def __init__(self, *, decode: int = 1, vllm: int = 2, extra: str = "") -> None:
        def urls(name: str, count: int) -> str:
            return ", ".join(f'"http://{name}{i}:1/v1"' for i in range(count))

        text = CONFIG.format(decode=urls("d", decode), vllm=urls("v", vllm)) + extra
        self.config = load_config_text(text, source="test.toml")
        self.clock = ManualClock()
        metrics = Metrics(providers=self.config.providers, models=[])
        self.pool = ProviderPool(self.config, metrics=metrics, env={}, clock=self.clock)
        self.router = Router(self.config)
        self.selector = Selector(config=self.config, pool=self.pool, rng=random.Random(1))
        self.held: list[tuple] = []

    def send(
        self,
        ttft_ms: Callable[[str], float],
        *,
        headers: dict[str, str] | None = None,
        hold: bool = False,
        itl_ms: Callable[[str], float] | None = None,
        max_tokens: int | None = None,
    ):
        """``itl_ms``: the stream's time per output token, reported when it ends (none
        without); ``max_tokens``: the request's cap."""
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        decision = self.router.decide(body, headers or {})
        plan = self.selector.plan(decision, body)
        runtime, endpoint = self.pool[plan.targets[0].provider], plan.endpoint
        self.pool.release(endpoint)
        ticket = self.pool.begin(runtime, endpoint, prompt_tokens=plan.prompt_tokens)
        self.clock.now += 0.01
        self.pool.record_first_token(runtime, endpoint, ticket, ttft_ms=ttft_ms(endpoint.config.id))
        self.pool.record_outcome(runtime, endpoint, ok=True, ticket=ticket)
        if itl_ms is not None:
            tokens = max_tokens or 256
            self.pool.record_decode(endpoint, tokens=tokens, seconds=itl_ms(endpoint.config.id) * (tokens - 1) / 1000.0)
        if hold:
            self.held.append((runtime, endpoint, ticket))
        else:
            self.pool.end(runtime, endpoint, ticket)
        return plan

    def release_all(self) -> None:
        for runtime, endpoint, ticket in self.held:
            self.pool.end(runtime, endpoint, ticket)
        self.held.clear()


def same(ms: float) -> Callable[[str], float]:
    return lambda endpoint: ms


def test_cold_after_ordinary_traffic_the_first_latency_sensitive_request_goes_to_the_decode_pool() -> None:
    rig = Rig()
    for _ in range(20):
        rig.send(same(7.0))
    for _ in range(50):
        plan = rig.send(same(7.0), headers={"x-latency-sensitive": "1"})
        assert plan.targets[0].provider == "decode" and plan.targets[0].reason == "latency_sensitive"


def test_identical_replicas_split_sequential_and_concurrent_traffic_evenly() -> None:
    rig = Rig()
    noise = random.Random(3)
    sequential = collections.Counter(rig.send(lambda e: 7.0 + noise.random()).endpoint.config.id for _ in range(40))
    assert abs(sequential["vllm-0"] - sequential["vllm-1"]) <= 2, sequential
    concurrent: collections.Counter[str] = collections.Counter()
    for _ in range(10):  # rounds of 8 requests in flight together
        for _ in range(8):
            concurrent[rig.send(lambda e: 7.0 + noise.random(), hold=True).endpoint.config.id] += 1
        rig.release_all()
    assert concurrent["vllm-0"] == concurrent["vllm-1"] == 40, concurrent


def test_load_the_engine_reports_moves_traffic_to_the_idle_replica() -> None:
    rig = Rig()
    for _ in range(10):
        rig.send(same(7.0))
    busy = rig.pool["vllm"].endpoints[0]
    rig.pool.record_engine_load(rig.pool["vllm"], busy, running=7, waiting=0)
    picks = collections.Counter(rig.send(same(7.0)).endpoint.config.id for _ in range(10))
    assert picks["vllm-1"] == 10, picks


class SlowFirst:
    """A per-endpoint time (ms): ``slow_ms`` for ``endpoint``'s first ``count`` requests,
    ``normal_ms`` for everything else; ``left``: slow requests still to come."""

    def __init__(self, endpoint: str, *, count: int, slow_ms: float, normal_ms: float) -> None:
        self.endpoint, self.left, self.slow_ms, self.normal_ms = endpoint, count, slow_ms, normal_ms

    def __call__(self, endpoint: str) -> float:
        if endpoint == self.endpoint and self.left > 0:
            self.left -= 1
            return self.slow_ms
        return self.normal_ms


def test_recovered_a_replica_slow_for_its_first_requests_gets_its_share_back() -> None:
    rig = Rig()
    ttft = SlowFirst("vllm-1", count=5, slow_ms=70.0, normal_ms=7.0)
    while ttft.left:
        rig.send(ttft)
    picks = collections.Counter(rig.send(ttft).endpoint.config.id for _ in range(100))
    assert picks["vllm-1"] >= 35, picks


def test_a_full_decode_pool_overflows_with_its_evidence() -> None:
    rig = Rig(extra="[providers.decode.hints]\nmax_num_seqs = 1\n")
    ls = {"x-latency-sensitive": "1", "x-latgate-debug": "1"}
    rig.send(same(5.0), headers=ls, hold=True)  # holds the decode pool's only slot
    plan = rig.send(same(5.0), headers=ls)
    assert plan.targets[0].provider == "vllm" and plan.targets[0].reason == "overflow:decode"
    assert plan.evidence is not None and plan.evidence.startswith("capacity")
    assert "left decode: capacity" in plan.explain_header()


def test_a_decode_pool_measured_too_slow_is_a_predicted_miss() -> None:
    rig = Rig()
    ls = {"x-latency-sensitive": "1", "x-latgate-debug": "1"}
    for _ in range(5):
        rig.send(same(900.0), headers=ls)
    plan = rig.send(same(900.0), headers=ls)
    assert plan.targets[0].reason == "predicted_miss:decode"
    assert plan.evidence is not None and "observations" in plan.evidence


def test_exploration_spends_few_latency_sensitive_requests_while_a_good_endpoint_exists() -> None:
    rig = Rig(decode=2)
    ls = {"x-latency-sensitive": "1"}
    for _ in range(6):
        rig.send(lambda e: 600.0 if e == "decode-1" else 5.0)  # each measured: decode-1 slow
    picks = collections.Counter(
        rig.send(lambda e: 600.0 if e == "decode-1" else 5.0, headers=ls).endpoint.config.id for _ in range(200)
    )
    assert picks["decode-1"] <= 6, picks  # at most routing.exploration_share (3%)


def test_a_busy_answer_is_capacity_evidence_for_a_while() -> None:
    rig = Rig()
    ls = {"x-latency-sensitive": "1", "x-latgate-debug": "1"}
    rig.pool.record_busy(rig.pool["decode"].endpoints[0], seconds=2.0)
    plan = rig.send(same(5.0), headers=ls)
    assert plan.targets[0].reason == "overflow:decode" and plan.evidence.startswith("capacity")
    rig.clock.now += 3.0
    assert rig.send(same(5.0), headers=ls).targets[0].provider == "decode"
