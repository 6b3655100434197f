"""A routing plan: the decision made concrete with live numbers (the provider order, the
first endpoint, a hedge), as :class:`~latgate.routing.selection.Selector` makes it and the
forwarder follows it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from latgate.live.providers import EndpointRuntime
from latgate.routing.prefix_index import PromptPrefix
from latgate.routing.targets import Target


@dataclass(slots=True)
class Considered:
    """One endpoint as the plan saw it (for ``X-Latgate-Debug`` and the admin view)."""

    provider: str
    endpoint: str
    predicted_ttft_ms: float
    p90_ttft_ms: float
    in_flight: int
    circuit: str
    chosen: bool = False
    observations: int = 0
    evidence: str | None = None
    predicted_itl_ms: float | None = None
    predicted_e2e_ms: float | None = None
    itl_observations: int = 0
    cached_tokens: int | None = None
    prefill_ms: float | None = None
    age_seconds: float | None = None  # since the last first token measured; None: none yet

    def as_dict(self) -> dict[str, Any]:
        return {
            "cached_tokens": self.cached_tokens,
            "prefill_ms": None if self.prefill_ms is None else round(self.prefill_ms, 1),
            "observations": self.observations,
            "age_seconds": None if self.age_seconds is None else round(self.age_seconds, 3),
            "predicted_itl_ms": None if self.predicted_itl_ms is None else round(self.predicted_itl_ms, 2),
            "itl_observations": self.itl_observations,
            "predicted_e2e_ms": None if self.predicted_e2e_ms is None else round(self.predicted_e2e_ms, 1),
            "evidence": self.evidence,
            "provider": self.provider,
            "endpoint": self.endpoint,
            "predicted_ttft_ms": round(self.predicted_ttft_ms, 1),
            "p90_ttft_ms": round(self.p90_ttft_ms, 1),
            "in_flight": self.in_flight,
            "circuit": self.circuit,
            "chosen": self.chosen,
        }


@dataclass(slots=True)
class Hedge:
    """Where a hedged request's second copy goes, and after how long without a first token."""

    target: Target
    endpoint: EndpointRuntime
    delay_ms: float


@dataclass(slots=True)
class RoutePlan:
    """The decision made concrete with live numbers.

    Attributes:
        targets: providers in the order to try them (``targets[0]`` first).
        endpoint: the first attempt's endpoint (of ``targets[0]``).
        prompt_tokens / budget_ms: the request's, as the plan used them.
        prompt_prefix: the prompt's samples and session
            (:mod:`latgate.routing.prefix_index`), for a provider keeping a prefix cache
            with several endpoints; None otherwise.
        conversation: the conversation the prompt belongs to
            (:func:`latgate.routing.strategies.placement.conversation_key`), or None.
        predicted_ttft_ms: the first endpoint's predicted TTFT (``latgate`` only).
        completion_tokens / completion_source: the completion tokens the request is
            expected to produce and where that came from (``observed``: recent streams';
            its ``max_tokens``... field; or ``default``: ``[routing]
            expected_completion_tokens``), as :meth:`Selector.expected_completion` gave
            them once for the request; the lease its slot is priced at.
        predicted_e2e_ms: the first endpoint's predicted e2e latency (``latgate``, with
            a budget or when explaining).
        overflow_from: the preferred provider, when the request overflowed from it.
        evidence: why it left the preferred provider (``capacity: ...`` or
            ``predicted_miss: ...``), for the debug view.
        cause: why the request may fail before reaching a healthy endpoint (every
            candidate's endpoints out of service), for its error and access log line.
        hedge: where a second copy goes and when, or None.
        considered: every endpoint looked at (filled when explaining).
        reserved: ``endpoint`` counts this request as load until its first attempt
            starts (see :meth:`ProviderPool.reserve`).
    """

    targets: tuple[Target, ...]
    endpoint: EndpointRuntime
    prompt_tokens: int
    budget_ms: int | None
    prompt_prefix: PromptPrefix | None = None
    conversation: int | None = None
    predicted_ttft_ms: float | None = None
    completion_tokens: int = 1
    completion_source: str = "default"
    predicted_e2e_ms: float | None = None
    overflow_from: str | None = None
    evidence: str | None = None
    cause: str | None = None
    hedge: Hedge | None = None
    considered: list[Considered] = field(default_factory=list)
    reserved: bool = False

    def explain_header(self) -> str:
        """``ENDPOINT TTFTms nOBS (AGEs old|prior)[ cached N prefill Pms][ itl ITLms e2e E2Ems][ CIRCUIT (EVIDENCE)][ chosen]; ...[; left FROM: EVIDENCE][; e2e for N completion tokens (SOURCE)]``
        for ``X-Latgate-Route-Candidates`` (``nOBS``: first tokens measured, ``AGEs old``:
        seconds since the last one, as ``/admin/providers`` ``ttft_model.age_seconds``, the
        prediction fading towards the prior as it ages; ``prior``: none yet; ``cached``:
        prompt tokens it is believed to hold, ``prefill``: the predicted prefill of the
        rest plus the fixed part; ``itl``: predicted time per output token, ``e2e``:
        TTFT plus ITL per further token)."""
        parts = []
        e2e = False
        for c in self.considered:
            age = "prior" if c.age_seconds is None or not c.observations else f"{c.age_seconds:.0f}s old"
            text = f"{c.endpoint} {c.predicted_ttft_ms:.0f}ms n{c.observations} ({age})"
            if c.cached_tokens is not None and c.prefill_ms is not None:
                text += f" cached {c.cached_tokens} prefill {c.prefill_ms:.0f}ms"
            if c.predicted_e2e_ms is not None and c.predicted_itl_ms is not None:
                e2e = True
                text += f" itl {c.predicted_itl_ms:.1f}ms e2e {c.predicted_e2e_ms:.0f}ms"
            if c.circuit != "closed":
                text += f" {c.circuit}" + (f" ({c.evidence})" if c.evidence else "")
            parts.append(text + (" chosen" if c.chosen else ""))
        if self.evidence is not None:
            parts.append(f"left {self.overflow_from}: {self.evidence}")
        if e2e:
            parts.append(f"e2e for {self.completion_tokens} completion tokens ({self.completion_source})")
        return "; ".join(parts)
