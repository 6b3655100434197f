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

from latgate.routing.policies.evidence import MIN_OBSERVATIONS
from latgate.routing.policies.predicted_ttft import choose_for_session, choose_power_of_two
from latgate.routing.strategies.base import Strategy
from latgate.routing.strategies.placement import Placements
from latgate.routing.strategies.registry import PREDICTED_LATENCY

if TYPE_CHECKING:
    from latgate.live.providers import EndpointRuntime, Ticket
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
        balance when it has no home; a committed choice is counted. Speeds are
        :func:`relative_speeds`."""
        runtime, views, plan = choice.runtime, choice.views, choice.plan
        now = self._clock()
        placements = self.placements
        counts = placements.counts(now=now)
        placed = placements.where(conversation)
        endpoints = runtime.endpoints
        ids = [ep.config.id for ep in endpoints]
        sessions = [counts.get(i, 0) - (i == placed) for i in ids]
        index = choose_for_session(
            views,
            prompt_tokens=plan.prompt_tokens,
            sessions=sessions,
            queued_tokens=[ep.prefill_tokens for ep in endpoints],
            speed=relative_speeds(endpoints),
            home=home,
            identity=conversation,
            trial_first=choice.trial_ok,
        )
        if choice.commit:
            placements.place(conversation, ids[index], now=now)
        return index


def relative_speeds(endpoints: list[EndpointRuntime]) -> list[float]:
    """Each endpoint's time per output token against the median measured endpoint's
    (1: as fast, 2: twice as slow), for :func:`choose_for_session`.

    Time per output token is measured on every stream, so it is known long before a
    prefill rate is, and the same compute runs both. Only endpoints with at least
    ``MIN_OBSERVATIONS`` streams are compared, with each other: one measured against
    another's prior says nothing of which is faster (a loaded host, or a model's real
    speed, puts every measurement off the prior), and an endpoint not yet measured
    counts as typical. The median, not the fastest, so that one lucky measurement makes
    no peer slow. Fewer than two measured endpoints: every speed is 1.
    """
    measured = [ep.itl.ms for ep in endpoints if ep.itl.ms is not None and ep.itl.observations >= MIN_OBSERVATIONS]
    if len(measured) < 2:
        return [1.0] * len(endpoints)
    typical = max(statistics.median(measured), 1e-3)
    return [
        max(ep.itl.ms, 1e-3) / typical if ep.itl.ms is not None and ep.itl.observations >= MIN_OBSERVATIONS else 1.0
        for ep in endpoints
    ]
