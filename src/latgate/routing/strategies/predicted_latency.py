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

from latgate.routing.policies.evidence import HALF_LIFE_S, MIN_OBSERVATIONS
from latgate.routing.policies.predicted_ttft import CLOSE_FRACTION, choose_for_session, choose_power_of_two
from latgate.routing.strategies.base import Strategy
from latgate.routing.strategies.placement import Placements
from latgate.routing.strategies.registry import PREDICTED_LATENCY

if TYPE_CHECKING:
    from latgate.live.providers import EndpointRuntime, Ticket
    from latgate.live.providers.prefill_rate import PrefillRate
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
            if prefix is not None and prefix.session is None and self.placements.where(conversation) is None:
                home = None  # a new conversation's longest prefix is the shared system prompt: nobody's home
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
            speed=relative_speeds(endpoints, now=now),
            home=home,
            identity=conversation,
            trial_first=choice.trial_ok,
        )
        if choice.commit:
            placements.place(conversation, ids[index], now=now)
        return index


SLOW_PREFILL_FACTOR = 2.0
"""A prefill rate counts once it is this many times the typical one: TTFT over work is
noisier than a stream's time per token (a fixed part, prefills overlapping), and this
signal is there to see a replica that slowed down, early."""


def relative_speeds(endpoints: list[EndpointRuntime], *, now: float) -> list[float]:
    """Each endpoint's time per token against the median measured endpoint's (1: as
    fast, 2: twice as slow), for :func:`choose_for_session`: the larger of two ratios.

    Time per output token, measured on every stream (the same compute runs prefill and
    decode). And the prefill rate (:mod:`latgate.live.providers.prefill_rate`), which
    sees a replica slow down at its next first token, or while its oldest prefill in
    flight overruns, before a stream of it ends; it counts from ``SLOW_PREFILL_FACTOR``.
    Only endpoints with at least ``MIN_OBSERVATIONS`` measurements are compared, with
    each other: one measured against another's prior says nothing of which is faster (a
    loaded host, or a model's real speed, puts every measurement off the prior), and an
    endpoint not yet measured counts as typical (an in-flight prefill's lower bound
    counts for it too). The median, not the fastest, so that one lucky measurement makes
    no peer slow. A measured slowness fades back towards 1 with the age of the
    measurement (halved every ``HALF_LIFE_S``): a replica that no turn reaches any more
    is tried again by one that has its slack there, and gets traffic back once it has
    recovered. Fewer than two measured endpoints: that ratio is 1 for every endpoint.
    Where the two disagree the other way (the streams' mean at least
    ``SLOW_PREFILL_FACTOR`` slower, the prefill rate's first tokens measured within
    ``CLOSE_FRACTION`` of typical, not faded nor a bound), the prefill rate counts: it is
    what a turn's work costs, and it restarts at a step change where the streams' mean
    moves 15% a stream, so a replica that slowed and recovered gets turns again at its
    first fast first tokens, not a minute later.
    """
    itl = [
        (ep.itl.ms, ep.itl.ms, ep.itl_observed_at) if ep.itl.observations >= MIN_OBSERVATIONS else (None, None, None)
        for ep in endpoints
    ]
    prefill = [_prefill_reading(ep.prefill_rate, now) for ep in endpoints]
    itl_ratios, prefill_ratios = _ratios(itl, now=now), _ratios(prefill, now=now)
    speeds = [max(a, b) if b >= SLOW_PREFILL_FACTOR else a for a, b in zip(itl_ratios, prefill_ratios, strict=True)]
    measured = [m is not None and at is not None for m, _, at in prefill]  # first tokens, not a bound
    if max(itl_ratios) >= SLOW_PREFILL_FACTOR and sum(measured) >= 2:  # the prefill rates unfaded
        unfaded = _ratios([(m, v, None) for m, v, _ in prefill], now=now)
        for i, (a, b) in enumerate(zip(itl_ratios, unfaded, strict=True)):
            if a >= SLOW_PREFILL_FACTOR and measured[i] and b <= 1.0 + CLOSE_FRACTION:
                speeds[i] = b
    return speeds


Reading = tuple[float | None, float | None, float | None]
"""One endpoint's (measured value with enough evidence or None, value now or None, clock
seconds it was measured at, None when it is a lower bound from now)."""


def _prefill_reading(rate: PrefillRate, now: float) -> Reading:
    measured = rate.ewma_ms_per_token if rate.observations >= MIN_OBSERVATIONS else None
    bound = rate.waiting_ms_per_token(now=now)
    if bound is not None and (measured is None or bound > measured):
        return measured, bound, None
    return measured, measured, rate.observed_at


def _ratios(readings: list[Reading], *, now: float) -> list[float]:
    """Each value now against the median of the measured ones, a slowness aged by when
    it was measured; 1 for every endpoint without two measured."""
    known = [measured for measured, _, _ in readings if measured is not None]
    if len(known) < 2:
        return [1.0] * len(readings)
    typical = max(statistics.median(known), 1e-3)
    out = []
    for _, value, at in readings:
        ratio = 1.0 if value is None else max(value, 1e-3) / typical
        if ratio > 1.0 and at is not None:
            ratio = 1.0 + (ratio - 1.0) * 0.5 ** (max(0.0, now - at) / HALF_LIFE_S)
        out.append(ratio)
    return out
