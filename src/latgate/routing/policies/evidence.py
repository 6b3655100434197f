"""Evidence and confidence: how much an endpoint's measured TTFT is believed, and when
a request leaves the provider its rule names.

An estimate is the endpoint's fitted TTFT line (:mod:`latgate.live.providers.predictor`)
blended with a prior by its confidence: ``weight / (weight + PRIOR_WEIGHT)``, where
``weight`` is the fit's recency-weighted observation count, halved for every
``half_life_s`` since the last observation. A fresh endpoint is its prior; one measured
often and lately is its measurements; one not measured for a while drifts back to the
prior, so one bad sample never bans an endpoint for good. The prior is what is known
before measuring: the median of the provider's other, confidently measured replicas,
else the role's prior line (a decode pool starts fast, a hosted upstream slow).

A latency-sensitive request leaves its rule's provider only on evidence
(:func:`leave_evidence`): the provider is at capacity (``capacity``: reason
``overflow:FROM``), or its estimate, on at least ``min_observations`` first tokens, is
over the budget (``predicted_miss``: reason ``predicted_miss:FROM``). An unmeasured
provider is not presumed slow.
"""

from __future__ import annotations

from collections.abc import Sequence

from latgate.routing.policies.view import EndpointView

PRIOR_WEIGHT = 1.0
"""The prior counts as this many observations."""
MIN_OBSERVATIONS = 3
"""First tokens before an estimate is evidence (below this an endpoint is explored)."""
HALF_LIFE_S = 30.0
STALE_AFTER_S = 10.0
STALE_AFTER_REQUESTS = 10
"""An estimate not refreshed for this long, or while the provider routed this many
requests elsewhere, is stale: the endpoint is explored again."""


def confidence(weight: float, age_s: float, *, half_life_s: float = HALF_LIFE_S) -> float:
    """How much the measurements count against the prior, 0..1.

    Args:
        weight: the fit's recency-weighted observation count (0 before any).
        age_s: seconds since its last observation.

    Example::

        confidence(3.0, 0.0)   # 0.75
        confidence(3.0, 30.0)  # 0.6
    """
    aged = weight * 0.5 ** (max(0.0, age_s) / half_life_s)
    return aged / (aged + PRIOR_WEIGHT)


def aged_estimate_ms(fitted_ms: float, prior_ms: float, trust: float) -> float:
    """The estimate: ``prior_ms`` moved towards ``fitted_ms`` by ``trust`` (0..1)."""
    return prior_ms + trust * (fitted_ms - prior_ms)


def peer_prior_ms(fitted_ms: Sequence[float]) -> float | None:
    """The median of the confidently measured replicas' fitted TTFTs, or None."""
    if not fitted_ms:
        return None
    ordered = sorted(fitted_ms)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def stale(*, observations: int, age_s: float, routed_elsewhere: int) -> bool:
    """True when an endpoint's estimate needs refreshing: fewer than
    ``MIN_OBSERVATIONS``, or older than ``STALE_AFTER_S``, or ``STALE_AFTER_REQUESTS``
    requests of its provider went elsewhere since it was last chosen."""
    return (
        observations < MIN_OBSERVATIONS or age_s >= STALE_AFTER_S or routed_elsewhere >= STALE_AFTER_REQUESTS
    )


def leave_evidence(
    views: Sequence[EndpointView],
    chosen: EndpointView,
    *,
    budget_ms: float,
    queue_p90_ms: float,
    min_observations: int = MIN_OBSERVATIONS,
) -> str | None:
    """Why a request with a TTFT budget should leave its rule's provider, or None to stay.

    Args:
        views: the provider's endpoints.
        chosen: the endpoint its own choice picked.
        budget_ms: the request's budget.
        queue_p90_ms: what the chosen endpoint's wait for a batch slot adds to its
            90th-percentile estimate.

    Returns:
        None while the chosen one's 90th-percentile estimate meets the budget (a queue
        the budget allows is waited in). Else ``"capacity"`` when every available
        endpoint is busy, or the chosen one's wait for a slot is what makes it miss;
        ``"predicted_miss"`` when it is measured (``min_observations`` first tokens) and
        its estimate misses the budget; None otherwise (no evidence: stay).

    Example::

        cold = EndpointView(observations=0, p90_ttft_ms=300.0)
        leave_evidence([cold], cold, budget_ms=200, queue_p90_ms=0.0)  # None: not measured
    """
    if chosen.p90_ttft_ms <= budget_ms:
        return None
    open_views = [v for v in views if v.available]
    if open_views and all(v.busy for v in open_views):
        return "capacity"
    if queue_p90_ms > 0.0 and chosen.p90_ttft_ms - queue_p90_ms <= budget_ms:
        return "capacity"
    if chosen.observations >= min_observations and not chosen.trial:
        return "predicted_miss"
    return None
