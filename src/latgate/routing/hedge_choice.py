"""Where a hedged request's second copy goes, and after how long: the fastest other
endpoint with a closed circuit, of the first attempt's provider or the plan's next
providers, and the delay from :func:`latgate.routing.policies.hedging.hedge_delay_ms`.
Chosen once when the plan is made (for its delay) and again when the hedge is sent,
since load may have moved in between.
"""

from __future__ import annotations

from latgate.live.providers.endpoint import EndpointRuntime
from latgate.live.providers.health import CLOSED, HALF_OPEN
from latgate.live.providers.pool import ProviderPool
from latgate.live.providers.runtime import ProviderRuntime
from latgate.routing.decision import Target
from latgate.routing.plan import Hedge, RoutePlan
from latgate.routing.policies.hedging import hedge_delay_ms
from latgate.routing.policies.view import EndpointView


def hedge_target(pool: ProviderPool, plan: RoutePlan) -> Hedge | None:
    """Where the hedge goes, chosen when it is sent (load may have moved since the
    plan): the fastest other endpoint with a closed circuit, of the first attempt's
    provider or the plan's next providers. None when there is none."""
    choice = _fastest_other(pool, plan, pool.clock())
    if choice is None or plan.hedge is None:
        return None
    return Hedge(target=choice[1], endpoint=choice[2], delay_ms=plan.hedge.delay_ms)


def planned_hedge(
    pool: ProviderPool, plan: RoutePlan, runtime: ProviderRuntime, views: list[EndpointView], now: float
) -> Hedge | None:
    """The hedge's delay, and where it would go now (it is chosen again when sent).
    The first provider's other endpoints are already in ``views`` (one per endpoint of
    ``runtime``, in order); the next providers are looked at only when none of them can
    take it."""
    choice: tuple[float, Target, EndpointRuntime] | None = None
    first: EndpointView | None = None
    if plan.targets[0].provider == runtime.name:
        for ep, view in zip(runtime.endpoints, views, strict=True):
            if ep is plan.endpoint:
                first = view
            elif view.available and not view.trial and (choice is None or view.predicted_ttft_ms < choice[0]):
                choice = (view.predicted_ttft_ms, plan.targets[0], ep)
    if choice is None:
        choice = _fastest_other(pool, plan, now)
    if choice is None:
        return None
    if first is None:
        first_trial = pool.breaker.circuit(plan.endpoint.key) == HALF_OPEN
        first_p90 = plan.endpoint.p90_ttft_ms(plan.prompt_tokens, now)
    else:
        first_trial, first_p90 = first.trial, first.p90_ttft_ms
    # a trial's own record is stale: wait for it as for a healthy endpoint
    p90 = 0.0 if first_trial else first_p90
    delay = hedge_delay_ms(p90_ttft_ms=p90, hedge_ttft_ms=choice[0], budget_ms=plan.budget_ms)
    return Hedge(target=choice[1], endpoint=choice[2], delay_ms=delay)


def _fastest_other(pool: ProviderPool, plan: RoutePlan, now: float) -> tuple[float, Target, EndpointRuntime] | None:
    tokens = plan.prompt_tokens
    best: tuple[float, Target, EndpointRuntime] | None = None
    for target in plan.targets[:3]:
        for ep in pool[target.provider].endpoints:
            if ep is plan.endpoint or pool.breaker.circuit(ep.key) != CLOSED:
                continue
            predicted = ep.predicted_ttft_ms(tokens, now)
            if best is None or predicted < best[0]:
                best = (predicted, target, ep)
    return best
