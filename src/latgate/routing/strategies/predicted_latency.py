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
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from latgate.routing.policies.predicted_ttft import choose_for_session, choose_power_of_two
from latgate.routing.strategies.base import Strategy
from latgate.routing.strategies.placement import Placements
from latgate.routing.strategies.registry import PREDICTED_LATENCY

if TYPE_CHECKING:
    from latgate.providers import EndpointRuntime, Ticket
    from latgate.routing.sessions import SessionMap
    from latgate.routing.strategies.base import Choice


class PredictedLatency(Strategy):
    """Predicted-TTFT choice, cache-aware; ``rng`` draws the pairs compared;
    ``sessions`` remembers where each client session was served."""

    name = PREDICTED_LATENCY
    predicts = True

    def __init__(
        self, *, rng: random.Random, sessions: SessionMap, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rng = rng
        self._sessions = sessions
        self._clock = clock
        self.placements = Placements()

    def on_first_token(self, endpoint: EndpointRuntime, ticket: Ticket) -> None:
        """The endpoint prefilled the ticket's prompt: its prefix index records it and
        the session map the endpoint."""
        prefix = ticket.prefix
        if prefix is not None and endpoint.prefix_index is not None:
            endpoint.prefix_index.record(prefix)
            if prefix.session is not None:
                self._sessions.put(prefix.session, endpoint.config.id)

    def choose(self, choice: Choice) -> int:
        runtime, views, plan = choice.runtime, choice.views, choice.plan
        prefix = plan.prompt_prefix if runtime.config.caches_prefixes else None
        conversation = plan.conversation if prefix is not None else None
        home = None
        if prefix is not None:
            home = next(
                (i for i, view in enumerate(views) if view.home and view.available and not view.trial), None
            )
        if conversation is not None and plan.budget_ms is None:
            return self._place(choice, conversation, home)
        explore = choice.explore
        draws = (self._rng.getrandbits(30), self._rng.getrandbits(30)) if len(views) > 2 else (0, 0)
        identity = None
        if prefix is not None:
            identity = prefix.session if prefix.session is not None else prefix.identity
            if home is not None:
                explore = False  # a held prefix is worth more than a fresh measurement
        return choose_power_of_two(
            views,
            draws=draws,
            trial_first=choice.trial_ok,
            turn=runtime.turn,
            explore=explore,
            compare_all=plan.budget_ms is not None or home is not None,
            budget_ms=plan.budget_ms,
            home=home,
            identity=identity,
        )

    def _place(self, choice: Choice, conversation: int, home: int | None) -> int:
        """One turn of a conversation (:func:`choose_for_session`), placed by session
        balance when it has no home; a committed choice is counted. An endpoint's speed
        is its time per output token against the median endpoint's (measured on every
        stream, so known long before a prefill rate is: the same compute runs both; the
        median, not the fastest, so that one lucky measurement makes no peer slow)."""
        runtime, views, plan = choice.runtime, choice.views, choice.plan
        now = self._clock()
        placements = self.placements
        counts = placements.counts(now=now)
        placed = placements.where(conversation)
        endpoints = runtime.endpoints
        ids = [ep.config.id for ep in endpoints]
        sessions = [counts.get(i, 0) - (i == placed) for i in ids]
        itl_ms = [max(ep.itl.ms if ep.itl.ms is not None else ep.itl.prior_ms, 1e-3) for ep in endpoints]
        typical = statistics.median(itl_ms)
        index = choose_for_session(
            views,
            prompt_tokens=plan.prompt_tokens,
            sessions=sessions,
            queued_tokens=[ep.prefill_tokens for ep in endpoints],
            speed=[ms / typical for ms in itl_ms],
            home=home,
            identity=conversation,
            trial_first=choice.trial_ok,
        )
        if choice.commit:
            placements.place(conversation, ids[index], now=now)
        return index
