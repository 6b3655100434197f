"""The JSON form of a routing decision: what ``latgate route`` prints and ``POST
/admin/route`` answers (one function, so the dry run and the live answer agree)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from latgate.foundation.config.schema import Config
from latgate.routing.decision import RouteDecision

if TYPE_CHECKING:
    from latgate.routing.plan import RoutePlan


def decision_json(decision: RouteDecision, config: Config, plan: RoutePlan | None = None) -> dict[str, Any]:
    """The printed form of ``decision``, each target with its provider's first endpoint id.

    With the live ``plan`` (``--url``, ``/admin/route``): the targets in the plan's
    order, the first with the endpoint chosen, and the plan's predictions, overflow,
    hedge and the endpoints it considered.
    """

    def endpoint(provider: str) -> str:
        return config.providers[provider].endpoints[0].id

    targets = plan.targets if plan is not None else decision.candidates
    first = targets[0]
    chosen = plan.endpoint.config.id if plan is not None else endpoint(first.provider)
    out: dict[str, Any] = {
        "provider": first.provider,
        "endpoint": chosen,
        "model": first.model,
        "public_model": decision.public_model,
        "reason": first.reason,
        "prompt_tokens": decision.prompt_tokens,
        "latency_sensitive": decision.latency_sensitive,
        "budget_ms": decision.budget_ms,
        "policy": decision.policy,
        "hedge": decision.hedge,
        "strategy": decision.strategy,
        "candidates": [
            {
                "provider": t.provider,
                "endpoint": chosen if i == 0 else endpoint(t.provider),
                "model": t.model,
                "reason": t.reason,
            }
            for i, t in enumerate(targets)
        ],
        "notes": list(decision.notes),
    }
    swapped = [t for t in targets if t.model != decision.public_model]
    out["notes"] += [f"{t.provider} is sent model {t.model!r} for {decision.public_model!r}" for t in swapped]
    if plan is not None:
        out["predicted_ttft_ms"] = None if plan.predicted_ttft_ms is None else round(plan.predicted_ttft_ms, 1)
        out["predicted_e2e_ms"] = None if plan.predicted_e2e_ms is None else round(plan.predicted_e2e_ms, 1)
        out["completion_tokens"] = {"expected": plan.completion_tokens, "from": plan.completion_source}
        out["overflow_from"] = plan.overflow_from
        out["evidence"] = plan.evidence
        out["hedge_plan"] = (
            None
            if plan.hedge is None
            else {
                "provider": plan.hedge.target.provider,
                "endpoint": plan.hedge.endpoint.config.id,
                "delay_ms": round(plan.hedge.delay_ms, 1),
            }
        )
        out["considered"] = [c.as_dict() for c in plan.considered]
    return out
