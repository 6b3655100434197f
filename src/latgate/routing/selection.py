"""Where a routed request goes: the provider order and the endpoint, from live numbers.

:class:`Selector` turns the :class:`~latgate.routing.decision.RouteDecision` (rules
only, no live numbers) into a :class:`RoutePlan` with ``routing.strategy``:

- ``round_robin`` / ``least_outstanding`` (``rules`` is the latter): the rules'
  provider order; endpoints in turn by weight (smooth weighted round robin), or the
  one with the fewest in flight per unit of weight.
- ``latgate``: each endpoint's predicted time to first token (queue wait plus its
  fitted line aged towards a prior by its confidence, :mod:`latgate.routing.policies.evidence`);
  power of two choices among them with load deciding between close predictions, an
  endpoint with thin or stale evidence explored (any request without a budget; at most
  ``routing.exploration_share`` of those with one while a measured endpoint can take
  them), or the prompt prefix's endpoint for providers with ``enable_prefix_cache``. A
  request with a budget leaves its rule's provider only on evidence: at capacity
  (reason ``overflow:FROM``) or measured too slow for the budget
  (``predicted_miss:FROM``), for the candidate most likely to meet it; hedging when
  the decision's policy asks for it (where the copy goes: :mod:`latgate.routing.hedge_choice`).

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

from latgate.config.schema import Config
from latgate.providers.endpoint import QUEUE_P90_FACTOR, EndpointRuntime
from latgate.providers.health import CLOSED, HALF_OPEN
from latgate.providers.pool import ProviderPool, ProviderRuntime
from latgate.providers.predictor import P90_SPREADS
from latgate.routing.decision import RouteDecision
from latgate.routing.hedge_choice import hedge_target, planned_hedge
from latgate.routing.plan import Considered, Hedge, RoutePlan
from latgate.routing.policies.deadline import first_token_deadline_ms
from latgate.routing.policies.e2e import expected_completion_tokens, predicted_e2e_ms
from latgate.routing.policies.evidence import (
    MIN_OBSERVATIONS,
    aged_estimate_ms,
    confidence,
    leave_evidence,
    peer_prior_ms,
    stale,
)
from latgate.routing.policies.least_outstanding import choose_least_outstanding
from latgate.routing.policies.overflow import choose_overflow
from latgate.routing.policies.predicted_ttft import choose_power_of_two
from latgate.routing.policies.prefix_affinity import choose_affine, endpoint_salt, keep_affinity, prefix_hash
from latgate.routing.policies.round_robin import choose_round_robin
from latgate.routing.policies.view import EndpointView
from latgate.routing.targets import Target

_STRATEGY = {"rules": "least_outstanding"}


class Selector:
    """The strategy of one config, over one pool's live numbers.

    Args:
        config: the resolved config (``routing.strategy``, timeouts).
        pool: the providers and their endpoints' live numbers.
        rng: random draws for power of two choices (seed it in tests).
    """

    def __init__(self, *, config: Config, pool: ProviderPool, rng: random.Random | None = None) -> None:
        self.strategy = _STRATEGY.get(config.routing.strategy, config.routing.strategy)
        self._pool = pool
        self._rng = rng or random.Random()
        self._exploration_share = config.routing.exploration_share
        self._expected_completion_tokens = config.routing.expected_completion_tokens
        timeout = config.defaults.first_token_timeout_sec
        self.configured_deadline_ms = timeout * 1000.0 if timeout else None
        self._salts = {
            ep.key: endpoint_salt(ep.config.id)
            for runtime in pool.providers.values()
            for ep in runtime.endpoints
        }

    def plan(self, decision: RouteDecision, body: Mapping[str, Any], *, commit: bool = True) -> RoutePlan:
        """The plan for ``decision``. ``commit=False`` (an explanation only) leaves the
        round-robin counters alone and fills ``considered``."""
        explain = decision.explain or not commit
        latgate = self.strategy == "latgate"
        targets = decision.candidates
        runtime = self._pool[targets[0].provider]
        plan = RoutePlan(
            targets=targets,
            endpoint=runtime.endpoints[0],
            prompt_tokens=decision.prompt_tokens,
            budget_ms=decision.budget_ms,
            prefix=decision.affinity_key,
        )
        plan.completion_tokens, plan.completion_source = expected_completion_tokens(
            body, default_tokens=self._expected_completion_tokens, observed_tokens=self._pool.completion_tokens_mean
        )
        now = self._pool.clock()
        e2e = decision.budget_ms is not None or explain
        views = self._views(runtime, plan, now, predict=latgate or explain, e2e=e2e)
        trial_ok = decision.budget_ms is None or decision.hedge
        explore = latgate and self._may_explore(runtime, views, decision.budget_ms)
        index = self._choose(runtime, views, plan, body, commit=commit, trial_ok=trial_ok, explore=explore)
        plan.endpoint = runtime.endpoints[index]
        best = views[index]
        if explain:
            self._consider(plan, runtime, views, index)
        if latgate:
            plan.predicted_ttft_ms = best.predicted_ttft_ms
            if e2e:
                plan.predicted_e2e_ms = best.predicted_e2e_ms
            if decision.budget_ms is not None and best.available:
                if decision.left is not None and (len(targets) > 1 or decision.overflow):
                    alternatives = (*targets[1:], *decision.overflow)
                    self._overflow(decision, plan, best, None, now, body, alternatives, explain=explain)
                elif decision.overflow:
                    queue_p90_ms = QUEUE_P90_FACTOR * plan.endpoint.queue_ms(now)
                    evidence = leave_evidence(views, best, budget_ms=decision.budget_ms, queue_p90_ms=queue_p90_ms)
                    if evidence is not None:
                        self._overflow(decision, plan, best, evidence, now, body, decision.overflow, explain=explain)
            if decision.left is not None and plan.overflow_from is None:
                plan.overflow_from = decision.left
        if not best.available and len(targets) > 1 and plan.overflow_from is None:
            self._skip_unavailable(plan, now, body, commit=commit)
        if not best.available and not self._pool.available(plan.endpoint):
            providers = ", ".join(dict.fromkeys(t.provider for t in plan.targets))
            plan.cause = f"every endpoint of {providers} is out of service (circuit open); tried anyway"
        if latgate and decision.hedge:
            plan.hedge = planned_hedge(self._pool, plan, runtime, views, now)
        if commit:
            if best.trial or plan.endpoint is not runtime.endpoints[index]:
                self._pool.take_trial(plan.endpoint)  # only a half-open endpoint has a trial to take
            if latgate:
                self._note_choice(runtime, plan, best if plan.endpoint is runtime.endpoints[index] else None)
            self._pool.reserve(plan.endpoint)
            plan.reserved = True
        return plan

    def _may_explore(self, runtime: ProviderRuntime, views: list[EndpointView], budget_ms: int | None) -> bool:
        """A request without a budget may explore; one with a budget only while no
        measured endpoint is known to meet it (or to be the best there is), or within the
        exploration share."""
        if budget_ms is None:
            return True
        best_p90 = min((v.p90_ttft_ms for v in views if v.available), default=math.inf)
        known_good = any(
            v.available and v.observations and not v.busy and (v.p90_ttft_ms <= budget_ms or v.p90_ttft_ms <= best_p90)
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
        views = self._views(runtime, plan, now, predict=self.strategy == "latgate")
        if len(exclude) and any(
            view.available for ep, view in zip(runtime.endpoints, views, strict=True) if ep not in exclude
        ):
            for ep, view in zip(runtime.endpoints, views, strict=True):
                if ep in exclude:
                    view.available = False
        endpoint = runtime.endpoints[self._choose(runtime, views, plan, {}, commit=True)]
        self._pool.take_trial(endpoint)
        return endpoint

    def deadline_ms(self, plan: RoutePlan, *, predicted_ttft_ms: float, last_attempt: bool) -> float | None:
        """The attempt's first-token deadline in ms (see :mod:`latgate.routing.policies.deadline`),
        ``predicted_ttft_ms`` being the endpoint's prediction before the attempt was
        counted in flight; the budget counts only under strategy ``latgate``."""
        return first_token_deadline_ms(
            budget_ms=plan.budget_ms if self.strategy == "latgate" else None,
            predicted_ttft_ms=predicted_ttft_ms,
            configured_ms=self.configured_deadline_ms,
            last_attempt=last_attempt,
        )

    # -- internals ---------------------------------------------------------------------

    def _views(
        self, runtime: ProviderRuntime, plan: RoutePlan, now: float, *, predict: bool, e2e: bool = False
    ) -> list[EndpointView]:
        """Snapshots of ``runtime``'s endpoints; with ``predict``, their predicted TTFT and
        evidence, and with ``e2e`` (or a budget) their predicted ITL and e2e latency."""
        circuit_of = self._pool.breaker.circuit
        salts = self._salts
        tokens = plan.prompt_tokens
        endpoints = runtime.endpoints
        circuits = [circuit_of(ep.key) for ep in endpoints]
        measured: list[float | None] = []
        measured_itl: list[float | None] = []
        e2e = predict and (e2e or plan.budget_ms is not None)
        if predict and len(endpoints) > 1:
            measured = [
                ep.predictor.predict_ms(tokens)
                if ep.predictor.observations >= MIN_OBSERVATIONS and circuit == CLOSED
                else None
                for ep, circuit in zip(endpoints, circuits, strict=True)
            ]
            if e2e:
                measured_itl = [
                    ep.itl.ms if ep.itl.observations >= MIN_OBSERVATIONS and circuit == CLOSED else None
                    for ep, circuit in zip(endpoints, circuits, strict=True)
                ]
        turn = runtime.turn
        views = []
        for index, (ep, circuit) in enumerate(zip(endpoints, circuits, strict=True)):
            trial = circuit == HALF_OPEN and now >= ep.trial_until
            view = EndpointView(ep.in_flight, circuit == CLOSED or trial, trial, 0.0, 0.0, salts[ep.key])
            view.weight = ep.config.weight
            if predict:
                predictor = ep.predictor
                view.others = ep.others(now) + ep.pending
                view.observations = observations = predictor.observations
                age_s = math.inf if ep.observed_at is None else now - ep.observed_at
                prior = None
                if measured:
                    prior = peer_prior_ms([m for i, m in enumerate(measured) if m is not None and i != index])
                if prior is None:
                    prior = predictor.prior_ms(tokens)
                trust = confidence(predictor.weight, age_s) if observations else 0.0
                fitted = aged_estimate_ms(predictor.predict_ms(tokens), prior, trust)
                spread = aged_estimate_ms(predictor.spread_ms, prior / 4, trust)
                queue = ep.queue_ms(now)
                view.predicted_ttft_ms = queue + fitted
                view.p90_ttft_ms = QUEUE_P90_FACTOR * queue + fitted + P90_SPREADS * spread
                view.busy = ep.busy(now)
                view.explore = stale(observations=observations, age_s=age_s, routed_elsewhere=turn - ep.chosen_turn)
                if e2e:
                    view.predicted_itl_ms = itl_ms = self._itl_ms(ep, index, measured_itl, now)
                    view.predicted_e2e_ms = predicted_e2e_ms(
                        ttft_ms=view.predicted_ttft_ms, itl_ms=itl_ms, completion_tokens=plan.completion_tokens
                    )
            views.append(view)
        return views

    @staticmethod
    def _itl_ms(ep: EndpointRuntime, index: int, measured_itl: list[float | None], now: float) -> float:
        """The endpoint's time per output token: its streams' mean blended with a prior
        by the same confidence as its TTFT fit (the prior: its measured replicas' median,
        else its role's)."""
        itl = ep.itl
        prior = None
        if measured_itl:
            prior = peer_prior_ms([m for i, m in enumerate(measured_itl) if m is not None and i != index])
        if prior is None:
            prior = itl.prior_ms
        if itl.ms is None:
            return prior
        age_s = math.inf if ep.itl_observed_at is None else now - ep.itl_observed_at
        return aged_estimate_ms(itl.ms, prior, confidence(itl.weight, age_s))

    def _choose(
        self,
        runtime: ProviderRuntime,
        views: list[EndpointView],
        plan: RoutePlan,
        body: Mapping[str, Any],
        *,
        commit: bool,
        trial_ok: bool = False,
        explore: bool = False,
    ) -> int:
        """The strategy's endpoint of ``runtime``; ``trial_ok``: this request may be a
        half-open endpoint's trial (it has no budget, or a hedge to save it);
        ``explore``: it may refresh an endpoint with thin or stale evidence."""
        if len(views) == 1:
            return 0
        strategy = self.strategy
        if strategy != "latgate":
            turn = runtime.turn
            if commit:
                runtime.turn = turn + 1
            if strategy == "round_robin":
                index, credit = choose_round_robin(views, credit=runtime.round_robin_credit)
                if commit:
                    runtime.round_robin_credit = credit
                return index
            return choose_least_outstanding(views, turn=turn)
        draws = (self._rng.getrandbits(30), self._rng.getrandbits(30)) if len(views) > 2 else (0, 0)
        budget = plan.budget_ms
        compare_all = budget is not None
        fastest = choose_power_of_two(
            views, draws=draws, trial_first=trial_ok, turn=runtime.turn, explore=explore, compare_all=compare_all, budget_ms=budget
        )
        if views[fastest].trial or not runtime.config.enable_prefix_cache:
            return fastest
        if plan.prefix is None and body:
            plan.prefix = prefix_hash(body)
        if plan.prefix is None:
            return fastest
        if explore and views[fastest].explore:  # a cached prefix is worth more than a fresh measurement
            fastest = choose_power_of_two(
                views, draws=draws, trial_first=trial_ok, turn=runtime.turn, compare_all=compare_all, budget_ms=budget
            )
        affine = choose_affine([v if not v.trial else _unavailable(v) for v in views], prefix=plan.prefix)
        if affine is None or not keep_affinity(views[affine], views[fastest], budget_ms=plan.budget_ms):
            return fastest
        return affine

    def _overflow(
        self,
        decision: RouteDecision,
        plan: RoutePlan,
        best: EndpointView,
        evidence: str | None,
        now: float,
        body: Mapping[str, Any],
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
            index = self._choose(runtime, views, plan, body, commit=False)
            view = views[index]
            ttfts.append(view.p90_ttft_ms if view.available else math.inf)
            e2es.append(view.predicted_e2e_ms if view.available else math.inf)
            choices.append((runtime, index))
            if explain:
                self._consider(plan, runtime, views, -1)
        pick = choose_overflow(ttfts, e2e_ms=e2es, budget_ms=decision.budget_ms or 0, keep_preferred=evidence is not None)
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

    def _skip_unavailable(
        self, plan: RoutePlan, now: float, body: Mapping[str, Any], *, commit: bool
    ) -> None:
        """Try first the first candidate that has an endpoint able to take traffic."""
        for position, target in enumerate(plan.targets[1:], start=1):
            runtime = self._pool[target.provider]
            views = self._views(runtime, plan, now, predict=self.strategy == "latgate")
            if any(view.available for view in views):
                plan.endpoint = runtime.endpoints[self._choose(runtime, views, plan, body, commit=commit)]
                plan.targets = (target, *plan.targets[:position], *plan.targets[position + 1 :])
                return

    def hedge_target(self, plan: RoutePlan) -> Hedge | None:
        """Where the hedge goes, chosen when it is sent (see :func:`latgate.routing.hedge_choice.hedge_target`)."""
        return hedge_target(self._pool, plan)

    def _consider(
        self, plan: RoutePlan, runtime: ProviderRuntime, views: list[EndpointView], chosen: int
    ) -> None:
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
                    evidence=ep.ejection_evidence,
                    predicted_itl_ms=view.predicted_itl_ms if view.predicted_itl_ms > 0 else None,  # 0: not predicted
                    predicted_e2e_ms=view.predicted_e2e_ms if view.predicted_itl_ms > 0 else None,
                    itl_observations=ep.itl.observations,
                )
            )


def _unavailable(view: EndpointView) -> EndpointView:
    return EndpointView(in_flight=view.in_flight, available=False, salt=view.salt)
