"""The snapshot a policy sees of one endpoint."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EndpointView:
    """One endpoint at decision time.

    Attributes:
        in_flight: requests latgate has on it.
        available: it may take the request: circuit closed, or half-open with no
            trial running (then this request is the trial).
        trial: half-open: this request would be its trial.
        predicted_ttft_ms: predicted time to first token (queue wait included), ms.
        p90_ttft_ms: a 90th-percentile estimate of the same, ms.
        salt: a stable number per endpoint (prefix affinity hashes with it).
    """

    in_flight: int = 0
    available: bool = True
    trial: bool = False
    predicted_ttft_ms: float = 0.0
    p90_ttft_ms: float = 0.0
    salt: int = 0


def usable(views: list[EndpointView]) -> list[int]:
    """Indexes of the available views; all of them when none is (a last resort beats
    refusing: an open circuit may have recovered)."""
    indexes = [i for i, view in enumerate(views) if view.available]
    return indexes or list(range(len(views)))
