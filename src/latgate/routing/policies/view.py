"""The snapshot a policy sees of one endpoint."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EndpointView:
    """One endpoint at decision time.

    Attributes:
        in_flight: requests latgate has on it (sent, or routed and about to be sent).
        available: it may take the request: circuit closed, or half-open with no
            trial running (then this request is the trial).
        trial: half-open: this request would be its trial.
        predicted_ttft_ms: predicted time to first token (queue wait included, evidence
            aged towards the prior, see :mod:`.evidence`), ms.
        p90_ttft_ms: a 90th-percentile estimate of the same, ms.
        salt: a stable number per endpoint (prefix affinity hashes with it).
        others: requests the engine reported beyond latgate's own (recent gauges only).
        weight: the endpoint's configured share of load (``weight``, default 1).
        observations: first tokens measured on it (the estimate's evidence).
        explore: its estimate is thin (fewer than the minimum observations) or stale
            (not refreshed for a while): a request may be spent to refresh it.
        busy: known to be at capacity (in flight at its batch size, or the engine
            reports a queue).
        predicted_itl_ms: predicted time per output token (its streams' mean aged
            towards the prior like the TTFT estimate), ms.
        predicted_e2e_ms: predicted TTFT plus ``predicted_itl_ms`` times the request's
            expected completion tokens after the first (:mod:`.e2e`), ms.
        cached_tokens: prompt tokens it is believed to hold in its prefix cache (the
            prediction prefills only the rest).
        prefill_ms: the predicted prefill of the uncached rest plus the fixed part, ms
            (``predicted_ttft_ms`` less the queue wait).
        home: the session's endpoint: it holds the longest prefix of the prompt, or the
            client's session was served there last.
    """

    in_flight: int = 0
    available: bool = True
    trial: bool = False
    predicted_ttft_ms: float = 0.0
    p90_ttft_ms: float = 0.0
    salt: int = 0
    others: int = 0
    weight: float = 1.0
    observations: int = 0
    explore: bool = False
    busy: bool = False
    predicted_itl_ms: float = 0.0
    predicted_e2e_ms: float = 0.0
    cached_tokens: int = 0
    prefill_ms: float = 0.0
    home: bool = False

    @property
    def load(self) -> float:
        """Requests on the endpoint (latgate's and the engine's others) per unit of weight."""
        return (self.in_flight + self.others) / self.weight


def usable(views: list[EndpointView]) -> list[int]:
    """Indexes of the available views; all of them when none is (a last resort beats
    refusing: an open circuit may have recovered)."""
    indexes = [i for i, view in enumerate(views) if view.available]
    return indexes or list(range(len(views)))
