"""Session placement over a run's phases on plain data (issue 21): a cold start, identical
replicas, a replica that slows down and recovers, and a header-less conversation whose
home slows. Each turn is :func:`choose_for_session` on the speeds :func:`relative_speeds`
reads from the endpoints' measurements at that time, with the conversations counted in a
:class:`Placements` as the strategy does."""

from __future__ import annotations

from types import SimpleNamespace

from latgate.live.providers.predictor import ItlEstimate
from latgate.live.providers.prefill_rate import PrefillRate
from latgate.routing.policies.predicted_ttft import choose_for_session
from latgate.routing.policies.view import EndpointView
from latgate.routing.strategies.placement import Placements
from latgate.routing.strategies.predicted_latency import relative_speeds
from tests.clocks import ManualClock

IDS = ("r0", "r1", "r2", "r3")
SYSTEM_TOKENS, TURN_TOKENS = 8_000, 1_600


def replica() -> SimpleNamespace:
    """An endpoint's measurements as :func:`relative_speeds` reads them: streams' time per
    output token and first tokens' prefill rate (none yet: a cold start)."""
    return SimpleNamespace(itl=ItlEstimate(prior_ms=5.0), itl_observed_at=None, prefill_rate=PrefillRate())


def measure(ep: SimpleNamespace, *, at: float, ms_per_token: float, streams_ms: float = 4.0) -> None:
    """Three first tokens of 1 600 tokens of work at ``ms_per_token`` and three streams,
    ending at ``at``."""
    for n in range(3):
        sent = at - 0.5 * (3 - n)
        ep.prefill_rate.sent((at, n), at=sent, work_tokens=TURN_TOKENS)
        ep.prefill_rate.prefilled((at, n), now=sent + TURN_TOKENS * ms_per_token / 1000.0)
        ep.itl.observe(streams_ms)
    ep.itl_observed_at = at


def turn(
    endpoints: list[SimpleNamespace],
    placements: Placements,
    conversation: int,
    *,
    history_tokens: list[int],
    now: float,
    home: int | None,
    queued: list[int] | None = None,
) -> int:
    """One turn of ``conversation`` (its prompt: its history plus a new turn), placed and
    counted as :class:`PredictedLatency` does; ``history_tokens``: what each endpoint holds
    of it."""
    counts = placements.counts(now=now)
    placed = placements.where(conversation)
    views = [EndpointView(cached_tokens=held, salt=i) for i, held in enumerate(history_tokens)]
    chosen = choose_for_session(
        views,
        prompt_tokens=max(history_tokens) + TURN_TOKENS,
        sessions=[counts.get(i, 0) - (i == placed) for i in IDS],
        queued_tokens=queued or [0] * len(endpoints),
        speed=relative_speeds(endpoints, now=now),
        home=home,
        identity=conversation,
    )
    placements.place(conversation, IDS[chosen], now=now)
    return chosen


def test_a_cold_start_spreads_new_conversations_evenly_over_identical_replicas() -> None:
    """Nothing measured, every replica holding only the shared system prompt: sixteen new
    conversations, four on each."""
    endpoints, placements, clock = [replica() for _ in IDS], Placements(), ManualClock(0.0)
    chosen = []
    for conversation in range(16):
        clock.now += 0.1
        chosen.append(turn(endpoints, placements, conversation, history_tokens=[SYSTEM_TOKENS] * 4, now=clock(), home=None))
    assert sorted(chosen.count(i) for i in range(4)) == [4, 4, 4, 4]


def test_identical_replicas_keep_every_conversation_home_under_small_queues() -> None:
    """Four measured identical replicas, four conversations each: every turn stays home
    though other replicas have a turn's worth less queued (the history there is most of
    the prompt)."""
    endpoints, placements = [replica() for _ in IDS], Placements()
    for ep in endpoints:
        measure(ep, at=5.0, ms_per_token=0.05)
    for conversation in range(16):
        placements.place(conversation, IDS[conversation % 4], now=5.0)
    for conversation in range(16):
        home = conversation % 4
        held = [SYSTEM_TOKENS] * 4
        held[home] = 24_000
        queued = [0] * 4
        queued[home] = TURN_TOKENS
        assert turn(endpoints, placements, conversation, history_tokens=held, now=6.0, home=home, queued=queued) == home


def test_a_replica_that_slows_sheds_its_conversations_and_gets_new_ones_once_it_recovers() -> None:
    """r3 measured ten times slower (first tokens and streams): a conversation's turn stays
    there only while its work at that speed is below a whole prefill elsewhere, and no new
    conversation is placed there although it holds fewest. Measured at full speed again
    (first tokens: the prefill rate restarts at a step change), a new conversation goes there."""
    endpoints, placements = [replica() for _ in IDS], Placements()
    for ep in endpoints[:3]:
        measure(ep, at=10.0, ms_per_token=0.05)
    measure(endpoints[3], at=10.0, ms_per_token=0.5, streams_ms=40.0)
    for conversation in range(12):
        placements.place(conversation, IDS[conversation % 3], now=10.0)
    placements.place(12, "r3", now=10.0)
    assert relative_speeds(endpoints, now=10.0)[3] >= 9.0
    history = [SYSTEM_TOKENS] * 3 + [24_000]
    # its own 1 600 tokens at 10x: 16 000 token-times, less than 17 600 uncached anywhere else
    assert turn(endpoints, placements, 12, history_tokens=history, now=10.1, home=3) == 3
    # a turn's worth queued ahead there too: 32 000, and the turn goes to a whole prefill elsewhere
    assert turn(endpoints, placements, 12, history_tokens=history, now=10.1, home=3, queued=[0, 0, 0, TURN_TOKENS]) != 3
    new = turn(endpoints, placements, 20, history_tokens=[SYSTEM_TOKENS] * 4, now=10.2, home=None)
    assert new != 3
    measure(endpoints[3], at=12.0, ms_per_token=0.05)  # recovered: its next first tokens say so
    assert relative_speeds(endpoints, now=12.0)[3] == 1.0  # the ITL mean still lags; the prefill rate restarted
    assert turn(endpoints, placements, 21, history_tokens=[SYSTEM_TOKENS] * 4, now=12.1, home=None) == 3


def test_a_headerless_conversation_leaves_a_home_whose_prefill_in_flight_overruns() -> None:
    """No session header: the home is the endpoint holding the longest prefix. Its first
    prefill after slowing down is 0.6 s into 80 ms of work (at least 7.5x slower): the turn
    goes to a whole prefill elsewhere (22 000 tokens against 7.5 x 1 600 queued and 1 600
    of its own); 0.1 s in (within noise), it stays."""
    endpoints, placements = [replica() for _ in IDS], Placements()
    for ep in endpoints:
        measure(ep, at=9.0, ms_per_token=0.05)
    for conversation in range(16):
        placements.place(conversation, IDS[conversation % 4], now=9.0)
    endpoints[3].prefill_rate.sent("slowed", at=10.0, work_tokens=TURN_TOKENS)
    held = [SYSTEM_TOKENS] * 3 + [28_400]
    queued = [0, 0, 0, TURN_TOKENS]
    assert turn(endpoints, placements, 3, history_tokens=held, now=10.1, home=3, queued=queued) == 3
    assert turn(endpoints, placements, 7, history_tokens=held, now=10.6, home=3, queued=queued) != 3


def test_a_replica_slower_all_along_is_not_priced_fast_before_its_first_tokens_are_measured() -> None:
    """r3's streams are twice as slow; its first tokens are not measured yet (one, below
    the evidence needed): its speed is its streams', 2, not 1."""
    endpoints = [replica() for _ in IDS]
    for ep in endpoints[:3]:
        measure(ep, at=10.0, ms_per_token=0.05)
    for _ in range(3):
        endpoints[3].itl.observe(8.0)
    endpoints[3].itl_observed_at = 10.0
    endpoints[3].prefill_rate.sent("one", at=9.0, work_tokens=TURN_TOKENS)
    endpoints[3].prefill_rate.prefilled("one", now=9.16)
    assert relative_speeds(endpoints, now=10.0)[3] == 2.0
