"""Where a routed request goes: the provider order and the endpoint, from live numbers.

:class:`Selector` turns the :class:`~latgate.routing.decision.RouteDecision` (rules
only, no live numbers) into a :class:`RoutePlan` with ``routing.strategy``:

- ``round_robin`` / ``least_outstanding`` (``rules`` is the latter): the rules'
  provider order; endpoints in turn by weight (smooth weighted round robin), or the
  one with the fewest in flight per unit of weight.
- ``predicted_latency`` (the default; ``latgate`` is its old name): each endpoint's
  predicted time to first token: its queue wait, the prefill of the prompt's tokens it
  is not believed to hold (its prefix index, :mod:`latgate.routing.prefix_index`, and
  the session's last endpoint, :mod:`latgate.routing.sessions`) on its fitted line aged
  towards a prior by its confidence (:mod:`latgate.routing.policies.evidence`), and the
  fixed part; power of two choices among them with load deciding between close
  predictions, then the session's endpoint; an endpoint with thin or stale evidence
  explored (any request without a budget; at most ``routing.exploration_share`` of
  those with one while a measured endpoint can take them). A request with a budget
  leaves its rule's provider only on evidence: at capacity (reason ``overflow:FROM``)
  or measured too slow for the budget (``predicted_miss:FROM``), for the candidate most
  likely to meet it; hedging when the decision's policy asks for it (where the copy
  goes: :mod:`latgate.routing.hedge_choice`).

The endpoints' snapshots are :mod:`latgate.routing.snapshots`'; the endpoint choice
itself is the configured strategy object's (:mod:`latgate.routing.strategies`).

Under every strategy, endpoints whose circuit is open are skipped while another can
take the request, and a provider with none left is tried after the fallbacks that
have one. The choices themselves are the pure functions of
:mod:`latgate.routing.policies`; this module only takes the snapshots.

What a plan costs is timed by ``benchmarks/routing_slo.py`` (``routing_cost_us``) and
kept in docs/performance.md.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from typing import Any

from latgate.foundation.config.schema import Config
from latgate.live.providers.endpoint import QUEUE_P90_FACTOR, EndpointRuntime
from latgate.live.providers.pool import ProviderPool
from latgate.live.providers.runtime import ProviderRuntime
from latgate.routing.decision import RouteDecision
from latgate.routing.hedge_choice import hedge_target, planned_hedge
from latgate.routing.plan import Considered, Hedge, RoutePlan
from latgate.routing.policies.deadline import first_token_deadline_ms
from latgate.routing.policies.e2e import expected_completion_tokens
from latgate.routing.policies.evidence import (
    MIN_OBSERVATIONS,
    leave_evidence,
)
from latgate.routing.policies.overflow import choose_overflow
from latgate.routing.policies.view import EndpointView
from latgate.routing.prefix_index import prompt_prefix
from latgate.routing.snapshots import Snapshots
from latgate.routing.strategies import Strategy, build_strategy
from latgate.routing.strategies.base import Choice
from latgate.routing.strategies.placement import conversation_key
from latgate.routing.targets import Target


class Selector:
    """The strategy of one config, over one pool's live numbers.

    Args:
        config: the resolved config (``routing.strategy``, timeouts).
        pool: the providers and their endpoints' live numbers.
        rng: random draws for power of two choices (seed it in tests).
    """

    def __init__(self, *, config: Config, pool: ProviderPool, rng: random.Random | None = None) -> None:
        self.strategy: Strategy = build_strategy(
            config.routing.strategy, sessions=pool.sessions, rng=rng or random.Random(), clock=pool.clock
        )
        self._pool = pool
        pool.on_first_token = self.strategy.on_first_token
        self._exploration_share = config.routing.exploration_share
        self._expected_completion_tokens = config.routing.expected_completion_tokens
        timeout = config.defaults.first_token_timeout_sec
        self.configured_deadline_ms = timeout * 1000.0 if timeout else None
        # providers where a prompt's prefix counts: a prefix cache and a choice of endpoints
        self._caching = frozenset(
            name
            for name, runtime in pool.providers.items()
            if self.strategy.predicts and runtime.config.caches_prefixes and len(runtime.endpoints) > 1
        )
        self._views = Snapshots(pool, caching=self._caching).take

    def expected_completion(
        self, body: Mapping[str, Any], *, priority: int | None = None, tenant: str = ""
    ) -> tuple[int, str]:
        """The completion tokens a request is expected to produce and where that came
        from (:func:`~latgate.routing.policies.e2e.expected_completion_tokens`): what its
        tenant's (else its class's, else the pool's) recent streams produced, at most its
        own ``max_tokens``; before any stream, that cap, else ``[routing]
        expected_completion_tokens``. Computed once per request (``Gateway.proxy``, before
        the key's token limits) and read by the limits, the gateway queue and the plan."""
        observed = self._pool.completion_lengths.expected(priority=priority, tenant=tenant)
        return expected_completion_tokens(
            body, default_tokens=self._expected_completion_tokens, observed_tokens=observed
        )

    def plan(
        self,
        decision: RouteDecision,
        body: Mapping[str, Any],
        *,
        commit: bool = True,
        completion: tuple[int, str] | None = None,
    ) -> RoutePlan:
        """The plan for ``decision``. ``commit=False`` (an explanation only) leaves the
        round-robin counters alone and fills ``considered``. ``completion``: the request's
        :meth:`expected_completion` (computed here when None: an explanation)."""
        explain = decision.explain or not commit
        predicts = self.strategy.predicts
        targets = decision.candidates
        runtime = self._pool[targets[0].provider]
        plan = RoutePlan(
            targets=targets,
            endpoint=runtime.endpoints[0],
            prompt_tokens=decision.prompt_tokens,
            budget_ms=decision.budget_ms,
        )
        caching = self._caching
        if caching and body and any(t.provider in caching for t in (*targets, *decision.overflow)):
            plan.prompt_prefix = prefix = prompt_prefix(
                body, prompt_tokens=decision.prompt_tokens, session=decision.session_key
            )
            if prefix is not None:
                plan.conversation = conversation_key(body, prefix)
        plan.completion_tokens, plan.completion_source = completion or self.expected_completion(body)
        now = self._pool.clock()
        e2e = decision.budget_ms is not None or explain
        views = self._views(runtime, plan, now, predict=predicts or explain, e2e=e2e)
        trial_ok = decision.budget_ms is None or decision.hedge
        explore = predicts and self._may_explore(runtime, views, decision.budget_ms)
        index = self._choose(runtime, views, plan, commit=commit, trial_ok=trial_ok, explore=explore)
        plan.endpoint = runtime.endpoints[index]
        best = views[index]
        if explain:
            self._consider(plan, runtime, views, index)
        if predicts:
            self._predicted(decision, plan, views, best, now, e2e=e2e, explain=explain)
        if not best.available and len(targets) > 1 and plan.overflow_from is None:
            self._skip_unavailable(plan, now, commit=commit)
        if not best.available and not self._pool.available(plan.endpoint):
            providers = ", ".join(dict.fromkeys(t.provider for t in plan.targets))
            plan.cause = f"every endpoint of {providers} is out of service (circuit open); tried anyway"
        if predicts and decision.hedge:
            plan.hedge = planned_hedge(self._pool, plan, runtime, views, now)
        if commit:
            if best.trial or plan.endpoint is not runtime.endpoints[index]:
                self._pool.take_trial(plan.endpoint)  # only a half-open endpoint has a trial to take
            if predicts:
                self._note_choice(runtime, plan, best if plan.endpoint is runtime.endpoints[index] else None)
            self._pool.reserve(plan.endpoint)
            plan.reserved = True
        return plan

    def _predicted(
        self,
        decision: RouteDecision,
        plan: RoutePlan,
        views: list[EndpointView],
        best: EndpointView,
        now: float,
        *,
        e2e: bool,
        explain: bool,
    ) -> None:
        """The chosen endpoint's predictions on ``plan``; for a request with a budget,
        the move to an alternative: from a provider already left (``decision.left``),
        or on evidence (at capacity, or measured too slow) to an overflow candidate."""
        plan.predicted_ttft_ms = best.predicted_ttft_ms
        if e2e:
            plan.predicted_e2e_ms = best.predicted_e2e_ms
        targets = decision.candidates
        if decision.budget_ms is not None and best.available:
            if decision.left is not None and (len(targets) > 1 or decision.overflow):
                alternatives = (*targets[1:], *decision.overflow)
                self._overflow(decision, plan, best, None, now, alternatives, explain=explain)
            elif decision.overflow:
                queue_p90_ms = QUEUE_P90_FACTOR * plan.endpoint.queue_ms(now)
                evidence = leave_evidence(views, best, budget_ms=decision.budget_ms, queue_p90_ms=queue_p90_ms)
                if evidence is not None:
                    self._overflow(decision, plan, best, evidence, now, decision.overflow, explain=explain)
        if decision.left is not None and plan.overflow_from is None:
            plan.overflow_from = decision.left

    def _may_explore(
        self, runtime: ProviderRuntime, views: list[EndpointView], budget_ms: int | None
    ) -> bool:
        """A request without a budget may explore; one with a budget only while no
        measured endpoint is known to meet it (or to be the best there is), or within the
        exploration share."""
        if budget_ms is None:
            return True
        best_p90 = min((v.p90_ttft_ms for v in views if v.available), default=math.inf)
        known_good = any(
            v.available
            and v.observations
            and not v.busy
            and (v.p90_ttft_ms <= budget_ms or v.p90_ttft_ms <= best_p90)
            for v in views
        )
        return not known_good or runtime.explored + 1 <= self._exploration_share * runtime.budgeted

    def _note_choice(self, runtime: ProviderRuntime, plan: RoutePlan, view: EndpointView | None) -> None:
        """Count the routed request for the exploration share and the endpoint's staleness."""
        chosen_runtime = self._pool[plan.targets[0].provider]
        chosen_runtime.turn += 1
        plan.endpoint.chosen_turn = chosen_runtime.turn
        if plan.budget_ms is not None:
            runtime.budgeted += 1
        if view is not None and view.explore:
            plan.endpoint.refresh = plan.endpoint.predictor.observations > 0
            plan.endpoint.itl_refresh = plan.endpoint.itl.observations >= MIN_OBSERVATIONS
            if plan.budget_ms is not None:
                runtime.explored += 1

    def next_endpoint(
        self, runtime: ProviderRuntime, plan: RoutePlan, *, exclude: list[EndpointRuntime]
    ) -> EndpointRuntime:
        """The endpoint of ``runtime`` for a further attempt, avoiding ``exclude`` (the
        endpoints already tried) while another can take it."""
        now = self._pool.clock()
        views = self._views(runtime, plan, now, predict=self.strategy.predicts)
        if len(exclude) and any(
            view.available for ep, view in zip(runtime.endpoints, views, strict=True) if ep not in exclude
        ):
            for ep, view in zip(runtime.endpoints, views, strict=True):
                if ep in exclude:
                    view.available = False
        endpoint = runtime.endpoints[self._choose(runtime, views, plan, commit=True)]
        self._pool.take_trial(endpoint)
        return endpoint

    def deadline_ms(self, plan: RoutePlan, *, predicted_ttft_ms: float, last_attempt: bool) -> float | None:
        """The attempt's first-token deadline in ms (see :mod:`latgate.routing.policies.deadline`),
        ``predicted_ttft_ms`` being the endpoint's prediction before the attempt was
        counted in flight; the budget counts only under a strategy that predicts."""
        return first_token_deadline_ms(
            budget_ms=plan.budget_ms if self.strategy.predicts else None,
            predicted_ttft_ms=predicted_ttft_ms,
            configured_ms=self.configured_deadline_ms,
            last_attempt=last_attempt,
        )

    # -- internals ---------------------------------------------------------------------

    def _choose(
        self,
        runtime: ProviderRuntime,
        views: list[EndpointView],
        plan: RoutePlan,
        *,
        commit: bool,
        **asks: bool,
    ) -> int:
        """The strategy's endpoint of ``runtime`` (``asks``: ``trial_ok``, ``explore``,
        see :class:`~latgate.routing.strategies.base.Choice`)."""
        if len(views) == 1:
            return 0
        return self.strategy.choose(Choice(runtime, views, plan, commit, **asks))

    def _overflow(
        self,
        decision: RouteDecision,
        plan: RoutePlan,
        best: EndpointView,
        evidence: str | None,
        now: float,
        alternatives: tuple[Target, ...],
        *,
        explain: bool,
    ) -> None:
        """Move the plan to the alternative predicted to finish first among those
        predicted to meet the budget (or stay when the preferred one still is the best,
        queue and all). ``evidence`` None: the rule's provider was already left
        (``decision.left``), so the planned one is kept for nothing but its numbers."""
        ttfts, e2es = [best.p90_ttft_ms], [best.predicted_e2e_ms]
        choices: list[tuple[ProviderRuntime, int]] = []
        for target in alternatives:
            runtime = self._pool[target.provider]
            views = self._views(runtime, plan, now, predict=True)
            index = self._choose(runtime, views, plan, commit=False)
            view = views[index]
            ttfts.append(view.p90_ttft_ms if view.available else math.inf)
            e2es.append(view.predicted_e2e_ms if view.available else math.inf)
            choices.append((runtime, index))
            if explain:
                self._consider(plan, runtime, views, -1)
        pick = choose_overflow(
            ttfts, e2e_ms=e2es, budget_ms=decision.budget_ms or 0, keep_preferred=evidence is not None
        )
        if pick == 0:
            return
        target = alternatives[pick - 1]
        if evidence == "predicted_miss":
            target = dataclasses.replace(target, reason=f"predicted_miss:{decision.provider}")
        runtime, index = choices[pick - 1]
        chosen = plan.endpoint
        if evidence is not None:
            plan.evidence = (
                f"{evidence} ({chosen.config.id} p90 {best.p90_ttft_ms:.0f}ms > budget {decision.budget_ms}ms, "
                f"{best.observations} observations)"
                if evidence == "predicted_miss"
                else f"{evidence} ({chosen.config.id} {chosen.load(now)} on {chosen.capacity or chosen.inferred_capacity or '?'} slots"
                f", p90 {best.p90_ttft_ms:.0f}ms)"
            )
            plan.overflow_from = decision.provider
        plan.endpoint = runtime.endpoints[index]
        plan.predicted_ttft_ms = plan.endpoint.predicted_ttft_ms(plan.prompt_tokens, now)
        plan.predicted_e2e_ms = e2es[pick]
        plan.targets = (target, *(t for t in plan.targets if t.provider != target.provider))
        for considered in plan.considered:
            considered.chosen = considered.endpoint == plan.endpoint.config.id

    def _skip_unavailable(self, plan: RoutePlan, now: float, *, commit: bool) -> None:
        """Try first the first candidate that has an endpoint able to take traffic."""
        for position, target in enumerate(plan.targets[1:], start=1):
            runtime = self._pool[target.provider]
            views = self._views(runtime, plan, now, predict=self.strategy.predicts)
            if any(view.available for view in views):
                plan.endpoint = runtime.endpoints[self._choose(runtime, views, plan, commit=commit)]
                plan.targets = (target, *plan.targets[:position], *plan.targets[position + 1 :])
                return

    def hedge_target(self, plan: RoutePlan) -> Hedge | None:
        """Where the hedge goes, chosen when it is sent (see :func:`latgate.routing.hedge_choice.hedge_target`)."""
        return hedge_target(self._pool, plan)

    def _consider(
        self, plan: RoutePlan, runtime: ProviderRuntime, views: list[EndpointView], chosen: int
    ) -> None:
        now = self._pool.clock()
        for index, (ep, view) in enumerate(zip(runtime.endpoints, views, strict=True)):
            plan.considered.append(
                Considered(
                    provider=runtime.name,
                    endpoint=ep.config.id,
                    predicted_ttft_ms=view.predicted_ttft_ms,
                    p90_ttft_ms=view.p90_ttft_ms,
                    in_flight=view.in_flight,
                    circuit=self._pool.breaker.circuit(ep.key),
                    chosen=index == chosen,
                    observations=ep.predictor.observations,
                    age_seconds=None if ep.observed_at is None else now - ep.observed_at,
                    evidence=ep.ejection_evidence,
                    predicted_itl_ms=view.predicted_itl_ms
                    if view.predicted_itl_ms > 0
                    else None,  # 0: not predicted
                    predicted_e2e_ms=view.predicted_e2e_ms if view.predicted_itl_ms > 0 else None,
                    itl_observations=ep.itl.observations,
                    cached_tokens=view.cached_tokens
                    if plan.prompt_prefix is not None and view.prefill_ms > 0
                    else None,
                    prefill_ms=view.prefill_ms
                    if plan.prompt_prefix is not None and view.prefill_ms > 0
                    else None,
                )
            )
