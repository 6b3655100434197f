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
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from latgate.routing.strategies.base import Strategy
from latgate.routing.strategies.predicted_latency import PredictedLatency
from latgate.routing.strategies.registry import LEAST_OUTSTANDING, PREDICTED_LATENCY, ROUND_ROBIN, canonical
from latgate.routing.strategies.static import LeastOutstanding, RoundRobin

if TYPE_CHECKING:
    from latgate.routing.sessions import SessionMap

__all__ = ["Strategy", "build_strategy"]


def build_strategy(
    name: str,
    *,
    sessions: SessionMap,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Strategy:
    """The strategy ``routing.strategy = name`` means, fresh; ``sessions``: where a
    client session's turns were served (kept by the pool, shared across replicas);
    ``clock``: seconds, monotonic (the pool's), for how long a conversation counts.

    Raises:
        KeyError: no such strategy (the config loader refuses such a name first).
    """
    kinds: Mapping[str, Any] = {
        PREDICTED_LATENCY: lambda: PredictedLatency(
            rng=rng or random.Random(), sessions=sessions, clock=clock
        ),
        ROUND_ROBIN: RoundRobin,
        LEAST_OUTSTANDING: LeastOutstanding,
    }
    return kinds[canonical(name)]()
