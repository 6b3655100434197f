"""The default strategy: the endpoint with the lowest predicted time to first token.

Each snapshot's prediction (filled by the selector) is the endpoint's queue wait, the
prefill of the prompt's part it is not believed to hold (:mod:`latgate.routing.prefix_index`)
and its fixed part. Power of two choices among them (:mod:`latgate.routing.policies.predicted_ttft`),
with every endpoint compared when one holds part of the prompt or the session's last
turn; between predictions within noise the least loaded wins, then the session's
endpoint (the one holding the longest prefix, or where a client session was last
served), then rendezvous hashing on the session (or the prompt's first message), so
that different sessions spread and one session keeps its place. So a session stays on
the endpoint holding its prefix while that is really faster for it, and moves when its
queue makes another faster. At each first token the endpoint's prefix index records
the prompt, and the session map the endpoint (:meth:`PredictedLatency.on_first_token`).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from latgate.routing.policies.predicted_ttft import choose_power_of_two
from latgate.routing.strategies.base import Strategy
from latgate.routing.strategies.registry import PREDICTED_LATENCY

if TYPE_CHECKING:
    from latgate.providers import EndpointRuntime, ProviderRuntime, Ticket
    from latgate.routing.plan import RoutePlan
    from latgate.routing.policies.view import EndpointView
    from latgate.routing.sessions import SessionMap


class PredictedLatency(Strategy):
    """Predicted-TTFT choice, cache-aware; ``rng`` draws the pairs compared;
    ``sessions`` remembers where each client session was served."""

    name = PREDICTED_LATENCY
    predicts = True

    def __init__(self, *, rng: random.Random, sessions: SessionMap) -> None:
        self._rng = rng
        self._sessions = sessions

    def on_first_token(self, endpoint: EndpointRuntime, ticket: Ticket) -> None:
        """The endpoint prefilled the ticket's prompt: its prefix index records it and
        the session map the endpoint."""
        prefix = ticket.prefix
        if prefix is not None and endpoint.prefix_index is not None:
            endpoint.prefix_index.record(prefix)
            if prefix.session is not None:
                self._sessions.put(prefix.session, endpoint.config.id)

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
        draws = (self._rng.getrandbits(30), self._rng.getrandbits(30)) if len(views) > 2 else (0, 0)
        prefix = plan.prompt_prefix if runtime.config.caches_prefixes else None
        home = None
        identity = None
        if prefix is not None:
            identity = prefix.session if prefix.session is not None else prefix.identity
            home = next((i for i, view in enumerate(views) if view.home and view.available and not view.trial), None)
            if home is not None:
                explore = False  # a held prefix is worth more than a fresh measurement
        return choose_power_of_two(
            views,
            draws=draws,
            trial_first=trial_ok,
            turn=runtime.turn,
            explore=explore,
            compare_all=plan.budget_ms is not None or home is not None,
            budget_ms=plan.budget_ms,
            home=home,
            identity=identity,
        )
