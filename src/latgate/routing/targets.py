"""What routing decides: the targets to try and the decision that carries them (read by
the selector, the forwarder, ``latgate route`` and the response headers)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Target:
    """One provider to try.

    Attributes:
        provider: the provider name.
        model: the model name sent upstream to this provider.
        reason: the route reason: the decision's reason for the primary,
            ``fallback:FROM`` for fallbacks.
        fallback_model: the public name of the requested model's ``fallback_model``
            when this target serves that instead of the requested model (reported as
            ``X-Latgate-Fallback-Model``), else None.
    """

    provider: str
    model: str
    reason: str
    fallback_model: str | None = None


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request goes and why.

    Attributes:
        provider, model, reason: the primary target (``model`` as sent upstream).
        public_model: the model name the client asked for (responses carry it).
        prompt_tokens: the prompt size routing used (estimate, or exact count when the
            long-context provider has a ``tokenizer``).
        latency_sensitive: the request was marked latency-sensitive by any means.
        budget_ms: time-to-first-token budget in ms: the header's, else the policy's,
            else ``latency_threshold_ms`` for latency-sensitive requests, else None.
        policy: the route policy in effect (None when none or unknown).
        hedge: the policy asks for hedged requests.
        candidates: ``candidates[0]`` is the primary, then fallbacks in order.
        notes: why rules or names were skipped, for logs and ``latgate route``.
        overflow: where the request may go instead of the primary when the primary is
            predicted to miss ``budget_ms`` (empty without a budget or unless the
            strategy is ``predicted_latency``).
        strategy: ``routing.strategy`` as configured.
        explain: the client asked for the candidates considered (``X-Latgate-Debug: 1``).
        left: the rule's provider the request already left before planning (admission
            could not hold it for a slot there within its budget), or None: the
            candidates then compete on predicted e2e latency, none kept for its rule.
        session_key: the client's session as a number (:func:`latgate.routing.sessions.session_key`:
            ``prompt_cache_key``, a session header, Claude Code's ``metadata.user_id``),
            hashed, never raw; None when there is none, or when no provider the request
            may go to keeps a prefix cache and has several endpoints (under strategy
            ``predicted_latency``).
    """

    provider: str
    model: str
    public_model: str
    reason: str
    prompt_tokens: int
    latency_sensitive: bool
    budget_ms: int | None
    policy: str | None
    hedge: bool
    candidates: tuple[Target, ...]
    notes: tuple[str, ...]
    overflow: tuple[Target, ...] = ()
    strategy: str = "predicted_latency"
    explain: bool = False
    session_key: int | None = None
    left: str | None = None
