"""Latency verdicts on an endpoint from its first tokens: eject one far slower than its
peers (:func:`~latgate.routing.policies.outlier.judge_outlier`), and end a latency
trial (one first token against the peers' fitted TTFT). The pool applies the circuit
transition returned."""

from __future__ import annotations

from typing import TYPE_CHECKING

from latgate.live.providers.health import CLOSED, CircuitBreaker, Transition
from latgate.routing.policies.outlier import LatencyEvidence, judge_outlier, too_slow

if TYPE_CHECKING:
    from latgate.foundation.config.schema import HealthConfig
    from latgate.live.providers.endpoint import EndpointRuntime
    from latgate.live.providers.runtime import ProviderRuntime
    from latgate.live.providers.ticket import Ticket

MIN_LATENCY_OBSERVATIONS = 10
"""First tokens an endpoint and its peers must have shown before one is judged slow (more
than a cold engine's first few slow requests)."""


def judge_latency(
    breaker: CircuitBreaker,
    settings: HealthConfig,
    provider: ProviderRuntime,
    endpoint: EndpointRuntime,
    ticket: Ticket,
    ttft_ms: float,
    *,
    censored: bool,
    now: float,
) -> Transition | None:
    """The circuit transition a first token (or a censored attempt's ``ttft_ms``, a lower
    bound) of ``ticket`` on ``endpoint`` calls for, or None. Sets the endpoint's
    ``ejection_evidence``; a trial that passes restarts its TTFT fit from this one."""
    if len(provider.endpoints) < 2:
        return None
    tokens = ticket.prompt_tokens
    if ticket.trial:
        peers = [
            ep.predictor.predict_ms(tokens)
            for ep in provider.endpoints
            if ep is not endpoint
            and ep.predictor.observations >= MIN_LATENCY_OBSERVATIONS
            and breaker.circuit(ep.key) == CLOSED
        ]
        if not peers:
            return None
        own = ttft_ms - ticket.queue_ms
        slow = too_slow(own, peers, factor=settings.latency_factor, margin_ms=settings.latency_margin_ms)
        if censored and not slow:
            return None  # no first token yet is no verdict of speed
        endpoint.ejection_evidence = f"trial ttft {own:.0f} ms against peers' {min(peers):.0f}-{max(peers):.0f} ms"
        if not slow:  # back: judged from now on by what it does next
            endpoint.predictor.restart(prompt_tokens=tokens, ttft_ms=own)
            endpoint.ejection_evidence = None
        return breaker.judge_latency(endpoint.key, too_slow=slow)
    if breaker.circuit(endpoint.key) != CLOSED:
        return None
    verdict = judge_outlier(
        _evidence(breaker, endpoint, tokens, now, measured_ms=ttft_ms if censored else None),
        [_evidence(breaker, ep, tokens, now) for ep in provider.endpoints if ep is not endpoint],
        factor=settings.latency_factor,
        margin_ms=settings.latency_margin_ms,
        min_observations=MIN_LATENCY_OBSERVATIONS,
        max_share=settings.max_ejection_share,
    )
    if not verdict.eject:
        return None
    endpoint.ejection_evidence = verdict.evidence
    return breaker.judge_latency(endpoint.key, too_slow=True)


def _evidence(
    breaker: CircuitBreaker, endpoint: EndpointRuntime, tokens: int, now: float, *, measured_ms: float | None = None
) -> LatencyEvidence:
    """``endpoint``'s record for :func:`judge_outlier` (``measured_ms``: a censored
    attempt's elapsed time, a lower bound that counts when above its average)."""
    predictor = endpoint.predictor
    measured = endpoint.measured_ttft_ms or predictor.predict_ms(tokens)
    if measured_ms is not None:
        measured = max(measured, measured_ms)
    return LatencyEvidence(
        fitted_ms=predictor.predict_ms(tokens),
        measured_ms=measured,
        observations=predictor.observations,
        queued=endpoint.busy(now) or endpoint.queue_ms(now) > 0.0,
        in_service=breaker.circuit(endpoint.key) == CLOSED,
        capacity=float(endpoint.capacity or endpoint.inferred_capacity or endpoint.config.weight),
    )
