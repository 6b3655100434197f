"""Strategies: how the endpoint of a provider is chosen, each an object owning its state.

A :class:`Strategy` answers :meth:`~Strategy.choose` (the index of the endpoint that
takes a request, over the selector's snapshots) and hears what became of it:
:meth:`~Strategy.on_first_token` (called by the pool). The
:class:`~latgate.routing.selection.Selector` calls the configured one
(:func:`build_strategy`); nothing else tests a strategy's name (the names:
:mod:`.registry`). What a strategy may not decide on its own (circuits, overflow for a
budget, hedges) stays in the selector, asked of :attr:`Strategy.predicts`.

- :class:`~.static.RoundRobin`, :class:`~.static.LeastOutstanding`: the rules' baselines.
- :class:`~.predicted_latency.PredictedLatency`: the default: the lowest predicted time
  to first token, cache-aware (:mod:`latgate.routing.prefix_index`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from latgate.routing.strategies.registry import LEAST_OUTSTANDING, PREDICTED_LATENCY, ROUND_ROBIN, canonical

if TYPE_CHECKING:
    from latgate.providers import EndpointRuntime, ProviderRuntime, Ticket
    from latgate.routing.plan import RoutePlan
    from latgate.routing.policies.view import EndpointView
    from latgate.routing.sessions import SessionMap


class Strategy:
    """One ``routing.strategy``: its choice and the state it keeps.

    Attributes:
        name: the strategy's name (aliases resolved, :mod:`.registry`).
        predicts: it routes on live predictions: the selector fills the snapshots'
            predicted TTFT, and overflows, hedges and ejects slow endpoints for it.
    """

    name = ""
    predicts = False

    def choose(
        self,
        runtime: ProviderRuntime,
        views: list[EndpointView],
        plan: RoutePlan,
        *,
        commit: bool,
        trial_ok: bool = False,
        explore: bool = False,
    ) -> int:
        """The index in ``views`` (``runtime``'s endpoints, more than one) of the
        endpoint that takes the request; ``commit`` False: an explanation only, no
        state changes. ``trial_ok``: the request may be a half-open endpoint's trial;
        ``explore``: it may refresh an endpoint with thin or stale evidence."""
        raise NotImplementedError

    def on_first_token(self, endpoint: EndpointRuntime, ticket: Ticket) -> None:
        """An attempt on ``endpoint`` produced its first token (the engine now holds
        its prompt)."""


def build_strategy(name: str, *, sessions: SessionMap, rng: random.Random | None = None) -> Strategy:
    """The strategy ``routing.strategy = name`` means, fresh; ``sessions``: where a
    client session's turns were served (kept by the pool, shared across replicas).

    Raises:
        KeyError: no such strategy (the config loader refuses such a name first).
    """
    from latgate.routing.strategies.predicted_latency import PredictedLatency
    from latgate.routing.strategies.static import LeastOutstanding, RoundRobin

    kinds: Mapping[str, Any] = {
        PREDICTED_LATENCY: lambda: PredictedLatency(rng=rng or random.Random(), sessions=sessions),
        ROUND_ROBIN: RoundRobin,
        LEAST_OUTSTANDING: LeastOutstanding,
    }
    return kinds[canonical(name)]()
