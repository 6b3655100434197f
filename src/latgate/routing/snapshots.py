"""Snapshots of a provider's endpoints for one request (:class:`~latgate.routing.policies.view.EndpointView`):
what the strategy chooses from.

With predictions, each endpoint's predicted time to first token is its queue wait,
the prefill of the prompt's tokens it is not believed to hold (its prefix index,
:mod:`latgate.routing.prefix_index`, and the session's last endpoint,
:mod:`latgate.routing.sessions`) on its fitted line aged towards a prior by its
confidence (:mod:`latgate.routing.policies.evidence`), and the fixed part; with
``e2e`` (or a budget), its time per output token and e2e latency too. The session's
endpoint is marked ``home``.
"""

from __future__ import annotations

import math

from latgate.live.providers.endpoint import QUEUE_P90_FACTOR, EndpointRuntime
from latgate.live.providers.health import CLOSED, HALF_OPEN
from latgate.live.providers.pool import ProviderPool
from latgate.live.providers.predictor import P90_SPREADS
from latgate.live.providers.runtime import ProviderRuntime
from latgate.routing.plan import RoutePlan
from latgate.routing.policies.e2e import predicted_e2e_ms
from latgate.routing.policies.evidence import (
    MIN_OBSERVATIONS,
    aged_estimate_ms,
    confidence,
    peer_prior_ms,
    stale,
)
from latgate.routing.policies.rendezvous import endpoint_salt
from latgate.routing.policies.view import EndpointView
from latgate.routing.prefix_index import PromptPrefix


class Snapshots:
    """Takes the snapshots of one pool's endpoints.

    Args:
        pool: the providers and their endpoints' live numbers.
        caching: providers where a prompt's prefix counts (a prefix cache and more
            than one endpoint, under a strategy that predicts).
    """

    def __init__(self, pool: ProviderPool, *, caching: frozenset[str]) -> None:
        self._pool = pool
        self._caching = caching
        self._salts = {
            ep.key: endpoint_salt(ep.config.id)
            for runtime in pool.providers.values()
            for ep in runtime.endpoints
        }

    # long: one pass over a provider's endpoints for every routed request (and each retry,
    # overflow candidate and hedge): the per-endpoint prediction inline, its inputs hoisted
    # out of the loop; a helper per endpoint would cost a call each on the request path
    def take(
        self, runtime: ProviderRuntime, plan: RoutePlan, now: float, *, predict: bool, e2e: bool = False
    ) -> list[EndpointView]:
        """Snapshots of ``runtime``'s endpoints; with ``predict``, their predicted TTFT
        (on the prompt tokens each is not believed to hold) and evidence, and with
        ``e2e`` (or a budget) their predicted ITL and e2e latency."""
        circuit_of = self._pool.breaker.circuit
        salts = self._salts
        tokens = plan.prompt_tokens
        endpoints = runtime.endpoints
        circuits = [circuit_of(ep.key) for ep in endpoints]
        measured: list[float | None] = []
        measured_itl: list[float | None] = []
        e2e = predict and (e2e or plan.budget_ms is not None)
        prefix = plan.prompt_prefix if predict and runtime.name in self._caching else None
        cached: list[int] = []
        if prefix is not None:
            cached = [self._pool.cached_tokens(ep, prefix) for ep in endpoints]
            if not any(cached):
                cached = []
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
                uncached = tokens
                if cached:
                    view.cached_tokens = cached[index]
                    uncached = max(0, tokens - cached[index])
                prior = None
                if measured:
                    if uncached == tokens:
                        prior = peer_prior_ms(
                            [m for i, m in enumerate(measured) if m is not None and i != index]
                        )
                    else:  # the peers' lines at this endpoint's uncached tokens
                        prior = peer_prior_ms(
                            [
                                endpoints[i].predictor.predict_ms(uncached)
                                for i, m in enumerate(measured)
                                if m is not None and i != index
                            ]
                        )
                if prior is None:
                    prior = predictor.prior_ms(uncached)
                trust = confidence(predictor.weight, age_s) if observations else 0.0
                fitted = aged_estimate_ms(predictor.predict_ms(uncached), prior, trust)
                view.prefill_ms = fitted
                spread = aged_estimate_ms(predictor.spread_ms, prior / 4, trust)
                queue = ep.queue_ms(now)
                view.predicted_ttft_ms = queue + fitted
                view.p90_ttft_ms = QUEUE_P90_FACTOR * queue + fitted + P90_SPREADS * spread
                view.busy = ep.busy(now)
                view.explore = stale(
                    observations=observations, age_s=age_s, routed_elsewhere=turn - ep.chosen_turn
                )
                if e2e:
                    view.predicted_itl_ms = itl_ms = self._itl_ms(ep, index, measured_itl, now)
                    view.predicted_e2e_ms = predicted_e2e_ms(
                        ttft_ms=view.predicted_ttft_ms,
                        itl_ms=itl_ms,
                        completion_tokens=plan.completion_tokens,
                    )
            views.append(view)
        if prefix is not None and predict:
            self._mark_home(endpoints, views, cached, prefix)
        return views

    def _mark_home(
        self,
        endpoints: list[EndpointRuntime],
        views: list[EndpointView],
        cached: list[int],
        prefix: PromptPrefix,
    ) -> None:
        """Mark the session's endpoint: where the client's session was served last; for a
        prompt naming no session, of more than one message, the one holding its longest
        prefix (none when none holds any)."""
        home = None
        if prefix.session is not None:
            served = self._pool.sessions.get(prefix.session)
            home = next((i for i, ep in enumerate(endpoints) if ep.config.id == served), None)
        elif cached and prefix.identity is not None:
            longest = max(cached)
            if longest > 0 and cached.count(longest) == 1:  # held by several: a shared prefix, no one's home
                home = cached.index(longest)
        if home is not None:
            views[home].home = True

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
