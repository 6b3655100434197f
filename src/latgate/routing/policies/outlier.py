"""Latency outliers: an endpoint far slower than its peers is ejected, although it
still answers (a thermally throttled GPU, a noisy neighbour, a degraded link).

Only on evidence, and with a ceiling (as Envoy's outlier detection bounds ejections by
``max_ejection_percent``): the endpoint is measured (enough first tokens of its own);
its slowness is not explained by its own queue (it is not at capacity) nor by overload
(most in-service endpoints are at capacity: every endpoint slow at once is no outlier);
it is slower than its peers both on its fitted line (queueing taken out) and on its
measured TTFT (queueing in), so an over- or under-estimated queue cannot make a healthy
endpoint look slow; and ejecting it leaves out of service at most ``max_share`` of the
provider's endpoints (at least one may go) and of its capacity, and never the last
endpoint in service.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def too_slow(own_ms: float, peers_ms: Sequence[float], *, factor: float, margin_ms: float) -> bool:
    """True when ``own_ms`` exceeds ``factor`` times the median of ``peers_ms`` plus
    ``margin_ms`` (all TTFTs for the same prompt size). False without peers.

    Example::

        too_slow(400.0, [20.0, 25.0], factor=3.0, margin_ms=50.0)  # True (> 117.5)
    """
    if not peers_ms:
        return False
    return own_ms > factor * statistics.median(peers_ms) + margin_ms


@dataclass(frozen=True, slots=True)
class LatencyEvidence:
    """One endpoint's latency record, as ejection sees it.

    Attributes:
        fitted_ms: its fitted TTFT for the prompt size, queueing taken out (ms).
        measured_ms: its recency-weighted measured TTFT, queueing in (ms).
        observations: first tokens measured on it.
        queued: it is at capacity now (in flight at its batch size, or the engine
            reports waiting requests).
        in_service: its circuit is closed.
        capacity: its batch slots (or weight when unknown), for the ceiling.
    """

    fitted_ms: float
    measured_ms: float
    observations: int
    queued: bool = False
    in_service: bool = True
    capacity: float = 1.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether to eject, and the evidence in words (for the log, debug view and admin)."""

    eject: bool
    evidence: str


def judge_outlier(
    own: LatencyEvidence,
    peers: Sequence[LatencyEvidence],
    *,
    factor: float,
    margin_ms: float,
    min_observations: int,
    max_share: float,
) -> Verdict:
    """Whether ``own`` (in service) is ejected as too slow against ``peers`` (the
    provider's other endpoints). The rules are the module docstring's.

    Example::

        fast = LatencyEvidence(fitted_ms=20.0, measured_ms=22.0, observations=9)
        slow = LatencyEvidence(fitted_ms=600.0, measured_ms=610.0, observations=9)
        judge_outlier(slow, [fast, fast], factor=3, margin_ms=50, min_observations=5, max_share=0.5).eject  # True
    """
    if own.observations < min_observations:
        return Verdict(False, f"{own.observations} observations, fewer than {min_observations}")
    if own.queued:
        return Verdict(False, "explained by its queue")
    serving = [p for p in peers if p.in_service]
    measured = [p for p in serving if p.observations >= min_observations]
    if not measured:
        return Verdict(False, "no measured peer in service")
    if sum(1 for p in (own, *serving) if p.queued) * 2 > len(serving) + 1:
        return Verdict(False, "overload: most endpoints at capacity")
    fitted_median = statistics.median(p.fitted_ms for p in measured)
    measured_median = statistics.median(p.measured_ms for p in measured)
    evidence = (
        f"ttft {own.measured_ms:.0f} ms measured, {own.fitted_ms:.0f} ms fitted on {own.observations} "
        f"observations; peers' median {measured_median:.0f} ms measured, {fitted_median:.0f} ms fitted; "
        f"limit {factor:g}x + {margin_ms:.0f} ms"
    )
    if not (
        too_slow(own.fitted_ms, [fitted_median], factor=factor, margin_ms=margin_ms)
        and too_slow(own.measured_ms, [measured_median], factor=factor, margin_ms=margin_ms)
    ):
        return Verdict(False, evidence)
    everyone = (own, *peers)
    out = [p for p in peers if not p.in_service]
    allowed = max(1, math.floor(max_share * len(everyone)))
    total_capacity = sum(p.capacity for p in everyone)
    out_capacity = sum(p.capacity for p in out) + own.capacity
    if len(out) + 1 > allowed or len(serving) == 0:
        return Verdict(False, evidence + f"; not ejected: {len(out)} of {len(everyone)} already out")
    if out_capacity > max_share * total_capacity + 1e-9:
        return Verdict(False, evidence + f"; not ejected: {out_capacity:g} of {total_capacity:g} slots would be out")
    return Verdict(True, evidence)
