"""Endpoint health: the circuit breaker, passive ejection on errors and on latency, and
half-open recovery, all on an injected clock."""

from __future__ import annotations

from clocks import ManualClock

from latgate.foundation.config import load_config_text
from latgate.foundation.config.schema import HealthConfig
from latgate.foundation.metrics import Metrics
from latgate.live.providers import ProviderPool
from latgate.live.providers.health import CircuitBreaker, MemoryCircuitStore


def breaker(clock: ManualClock, **settings: float) -> CircuitBreaker:
    return CircuitBreaker(settings=HealthConfig(**settings), store=MemoryCircuitStore(), clock=clock)


def test_five_failures_in_a_row_open_the_circuit() -> None:
    b = breaker(ManualClock())
    for _ in range(4):
        assert b.on_failure("p:p-0") is None
    transition = b.on_failure("p:p-0")
    assert transition is not None and transition.after == "open" and transition.reason == "errors"
    assert b.circuit("p:p-0") == "open"


def test_a_success_in_between_resets_the_count() -> None:
    b = breaker(ManualClock())
    for _ in range(4):
        b.on_failure("k")
    b.on_success("k")
    for _ in range(4):
        b.on_failure("k")
    assert b.circuit("k") == "closed"


def test_an_open_circuit_turns_half_open_after_open_sec() -> None:
    clock = ManualClock()
    b = breaker(clock, open_sec=5.0)
    for _ in range(5):
        b.on_failure("k")
    clock.now += 4.9
    assert b.circuit("k") == "open"
    clock.now += 0.2
    assert b.circuit("k") == "half_open"


def test_a_successful_trial_closes_the_circuit() -> None:
    clock = ManualClock()
    b = breaker(clock, open_sec=5.0)
    for _ in range(5):
        b.on_failure("k")
    clock.now += 5.0
    transition = b.on_success("k")
    assert transition is not None and transition.after == "closed" and b.circuit("k") == "closed"


def test_a_failed_trial_opens_it_again_for_twice_as_long_up_to_the_maximum() -> None:
    clock = ManualClock()
    b = breaker(clock, open_sec=5.0, max_open_sec=15.0)
    for _ in range(5):
        b.on_failure("k")
    lengths = []
    for _ in range(3):
        clock.now += 100.0
        assert b.circuit("k") == "half_open"
        b.on_failure("k")
        lengths.append(b.store.get("k").open_seconds)
    assert lengths == [10.0, 15.0, 15.0]


def test_failed_probes_open_the_circuit_and_good_probes_bring_it_back_before_the_time_out() -> None:
    clock = ManualClock()
    b = breaker(clock, open_sec=60.0)
    b.on_probe("k", ok=False)
    assert b.circuit("k") == "closed"
    b.on_probe("k", ok=False)
    assert b.circuit("k") == "open" and b.store.get("k").reason == "probes"
    b.on_probe("k", ok=True)
    assert b.circuit("k") == "half_open", "the engine answers again: a trial now, not in 60 s"
    b.on_probe("k", ok=True)
    assert b.circuit("k") == "closed"


def test_an_engine_answering_its_load_gauges_gives_an_errored_endpoint_its_trial_at_once() -> None:
    b = breaker(ManualClock(), open_sec=60.0)
    for _ in range(5):
        b.on_failure("k")
    assert b.circuit("k") == "open"
    transition = b.on_alive("k")
    assert transition is not None and b.circuit("k") == "half_open"
    b.eject("slow", reason="latency")
    assert b.on_alive("slow") is None and b.circuit("slow") == "open", "answering says nothing of speed"


def test_a_latency_ejection_is_ended_by_a_fast_trial_not_by_a_probe_or_a_success() -> None:
    clock = ManualClock()
    b = breaker(clock, open_sec=5.0)
    b.judge_latency("k", too_slow=True)
    clock.now += 5.0
    b.on_probe("k", ok=True)
    b.on_success("k")
    assert b.circuit("k") == "half_open"
    b.judge_latency("k", too_slow=False)
    assert b.circuit("k") == "closed"


# --- the pool: passive ejection as the forwarder reports outcomes ---------------------

POOL_CONFIG = """
[providers.p]
endpoints = ["http://a:1", "http://b:1", "http://c:1"]
[health]
open_sec = 10
"""


def pool(clock: ManualClock, text: str = POOL_CONFIG, *, metrics: Metrics | None = None) -> ProviderPool:
    config = load_config_text(text, source="test.toml")
    metrics = metrics or Metrics(providers=config.providers, models=[])
    return ProviderPool(config, metrics=metrics, env={}, clock=clock)


def metric(metrics: Metrics, endpoint: str, name: str = "latgate_provider_healthy", **labels: str) -> float | None:
    """A sample of the gauge or counter ``name`` of provider ``p``'s ``endpoint``."""
    return metrics.registry.get_sample_value(name, {"provider": "p", "endpoint": endpoint, **labels})


def first_tokens(p: ProviderPool, index: int, ttft_ms: float, count: int, *, tokens: int = 500) -> None:
    runtime = p["p"]
    endpoint = runtime.endpoints[index]

    for _ in range(count):
        ticket = p.begin(runtime, endpoint, prompt_tokens=tokens)
        p.record_first_token(runtime, endpoint, ticket, ttft_ms=ttft_ms)
        p.record_outcome(runtime, endpoint, ok=True, ticket=ticket)
        p.end(runtime, endpoint, ticket)


def test_errors_eject_an_endpoint_and_the_gauge_says_so() -> None:
    metrics = Metrics(providers=["p"], models=[])
    p = pool(ManualClock(), metrics=metrics)
    runtime = p["p"]
    for _ in range(5):
        p.record_outcome(runtime, runtime.endpoints[0], ok=False)
    assert not runtime.endpoints[0].healthy and not p.available(runtime.endpoints[0])
    assert metric(metrics, "p-0") == 0.0 and metric(metrics, "p-1") == 1.0
    assert metric(metrics, "p-0", "latgate_ejections_total", reason="errors") == 1.0
    assert p.any_healthy()


def test_an_ejected_endpoint_gets_one_trial_after_its_time_out_and_is_back_when_it_succeeds() -> None:
    clock = ManualClock()
    metrics = Metrics(providers=["p"], models=[])
    p = pool(clock, metrics=metrics)
    runtime = p["p"]
    ep = runtime.endpoints[0]
    for _ in range(5):
        p.record_outcome(runtime, ep, ok=False)
    clock.now += 10.0
    assert p.available(ep)

    ticket = p.begin(runtime, ep)
    assert ticket.trial and not p.available(ep), "one trial at a time"
    p.record_outcome(runtime, ep, ok=True, ticket=ticket)
    p.end(runtime, ep, ticket)
    assert ep.healthy and metric(metrics, "p-0") == 1.0


def test_an_endpoint_far_slower_than_its_peers_is_ejected_for_latency() -> None:
    p = pool(ManualClock())
    first_tokens(p, 0, 20.0, 10)
    first_tokens(p, 1, 25.0, 10)
    first_tokens(p, 2, 400.0, 9)
    assert p["p"].endpoints[2].healthy, "not judged before ten first tokens"
    first_tokens(p, 2, 400.0, 1)
    ep = p["p"].endpoints[2]
    assert not ep.healthy and p.breaker.store.get(ep.key).reason == "latency"
    assert ep.ejection_evidence is not None and "400 ms measured" in ep.ejection_evidence
    described = p.describe()["p"]["endpoints"][2]
    assert described["ejection_evidence"] == ep.ejection_evidence
    assert p["p"].endpoints[0].healthy and p["p"].endpoints[1].healthy


def test_a_slow_endpoint_comes_back_after_a_fast_trial_with_a_fresh_prediction() -> None:
    clock = ManualClock()
    p = pool(clock)
    first_tokens(p, 0, 20.0, 10)
    first_tokens(p, 1, 25.0, 10)
    first_tokens(p, 2, 400.0, 10)
    ep = p["p"].endpoints[2]
    clock.now += 10.0
    first_tokens(p, 2, 400.0, 1)  # still slow: out for twice as long
    assert not ep.healthy and p.breaker.store.get(ep.key).open_seconds == 20.0
    clock.now += 20.0
    first_tokens(p, 2, 22.0, 1)  # recovered
    assert ep.healthy
    assert ep.predictor.predict_ms(500) < 50.0, "judged by what it does now, not by its slow past"


def test_latency_ejection_needs_the_latgate_strategy() -> None:
    p = pool(ManualClock(), POOL_CONFIG + '[routing]\nstrategy = "round_robin"\n')
    first_tokens(p, 0, 20.0, 5)
    first_tokens(p, 1, 25.0, 5)
    first_tokens(p, 2, 400.0, 5)
    assert p["p"].endpoints[2].healthy


def test_a_lone_endpoint_is_never_ejected_for_latency() -> None:
    p = pool(ManualClock(), '[providers.p]\napi_base = "http://a:1"\n')
    first_tokens(p, 0, 5000.0, 10)
    assert p["p"].endpoints[0].healthy


def test_replicas_share_health_through_the_healthy_attribute() -> None:
    """The shared-state sync (latgate.live.store.health) sets and reads ``healthy``."""
    p = pool(ManualClock())
    ep = p["p"].endpoints[1]
    ep.healthy = False
    assert not p.available(ep) and p.breaker.store.get(ep.key).reason == "shared"
    ep.healthy = True
    assert p.available(ep) and ep.consecutive_failures == 0


def test_a_half_open_endpoint_gets_one_trial_even_when_requests_are_routed_together() -> None:
    from latgate.routing.decision import Router
    from latgate.routing.selection import Selector

    clock = ManualClock()
    p = pool(clock, '[providers.p]\nendpoints = ["http://a:1", "http://b:1"]\n[health]\nopen_sec = 10\n')
    router, selector = Router(p.config), Selector(config=p.config, pool=p)
    p.breaker.eject("p:p-1", reason="latency")
    clock.now += 10.0
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    first = selector.plan(router.decide(body, {}), body)
    second = selector.plan(router.decide(body, {}), body)  # before the first was even sent
    assert first.endpoint.config.id == "p-1", "the half-open endpoint gets its trial first"
    assert second.endpoint.config.id == "p-0", "and only one"
