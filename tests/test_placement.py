"""Session placement on plain data: which conversation a prompt belongs to, how many
each endpoint holds, and where a conversation's turn goes (issue 21)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from latgate.live.providers.predictor import ItlEstimate
from latgate.live.providers.prefill_rate import PrefillRate
from latgate.routing.policies.predicted_ttft import choose_for_session
from latgate.routing.policies.view import EndpointView
from latgate.routing.prefix_index import prompt_prefix
from latgate.routing.strategies.placement import Placements, conversation_key
from latgate.routing.strategies.predicted_latency import relative_speeds

SYSTEM = {"role": "system", "content": "You are a coding agent. " + "rules " * 500}


def turns(name: str, count: int) -> list[dict]:
    messages: list[dict] = [SYSTEM]
    bodies = []
    for turn in range(count):
        if turn:
            messages.append({"role": "assistant", "content": f"done {turn}"})
        messages.append({"role": "user", "content": f"{name} asks {turn}: " + "code " * 300})
        bodies.append({"model": "m", "messages": list(messages)})
    return bodies


def key(body: dict, session: int | None = None) -> int | None:
    prefix = prompt_prefix(body, prompt_tokens=4000, session=session)
    assert prefix is not None
    return conversation_key(body, prefix)


def test_every_turn_of_a_headerless_session_is_one_conversation_and_sessions_differ() -> None:
    a, b = turns("alice", 4), turns("bob", 4)
    assert len({key(body) for body in a}) == 1
    assert key(a[0]) != key(b[0])  # one system prompt, different first user messages


def test_a_client_session_is_the_conversation_and_a_lone_message_is_none() -> None:
    assert key(turns("alice", 2)[1], session=42) == 42
    assert key({"messages": [{"role": "user", "content": "hi"}]}) is None
    user_first = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]}
    assert key(user_first) is not None


def test_placements_count_conversations_per_endpoint_and_forget_idle_ones() -> None:
    placements = Placements(idle_seconds=300.0, max_conversations=3)
    placements.place(1, "a", now=0.0)
    placements.place(2, "a", now=1.0)
    placements.place(1, "b", now=2.0)  # moved: counted once, where it is now
    assert dict(placements.counts(now=3.0)) == {"a": 1, "b": 1}
    assert placements.where(1) == "b"
    placements.place(3, "c", now=4.0)
    placements.place(4, "c", now=5.0)  # a fourth: the least recently routed (2) goes
    assert placements.where(2) is None and len(placements) == 3
    assert dict(placements.counts(now=304.5)) == {"a": 0, "b": 0, "c": 1}  # 1 and 3 idle past 300 s


def views(*cached: int) -> list[EndpointView]:
    return [EndpointView(cached_tokens=c, salt=i) for i, c in enumerate(cached)]


def place(endpoints: list[EndpointView], **kwargs) -> int:
    count = len(endpoints)
    kwargs.setdefault("prompt_tokens", 30_000)
    kwargs.setdefault("sessions", [3] * count)
    kwargs.setdefault("queued_tokens", [0] * count)
    kwargs.setdefault("speed", [1.0] * count)
    kwargs.setdefault("home", None)
    kwargs.setdefault("identity", 9)
    return choose_for_session(endpoints, **kwargs)


def test_a_turn_stays_home_though_another_endpoint_is_less_loaded_and_holds_fewer_sessions() -> None:
    endpoints = views(28_400, 8_000, 8_000)
    endpoints[0].in_flight = 3  # small-integer noise: home's load decides nothing
    # 3 200 tokens queued ahead at home: its 4 800 against 22 000 anywhere else
    assert place(endpoints, home=0, sessions=[5, 1, 1], queued_tokens=[3_200, 0, 0]) == 0


def test_a_turn_leaves_home_when_its_queue_outweighs_another_s_uncached_prefill() -> None:
    endpoints = views(28_400, 8_000, 8_000, 8_000)
    queued = [40_000, 0, 1_000, 0]  # 41 600 tokens of work at home, 22 000-23 000 elsewhere
    assert place(endpoints, home=0, sessions=[4, 5, 3, 4], queued_tokens=queued) == 2  # the fewest sessions among those close
    assert place(endpoints, home=0, sessions=[4, 5, 3, 4], queued_tokens=queued, speed=[1.0, 1.0, 2.0, 1.0]) == 3


def test_a_new_session_goes_where_sessions_are_fewest_not_where_requests_are() -> None:
    endpoints = views(8_000, 8_000, 0, 8_000)  # endpoint 2 lacks the shared system prompt
    endpoints[0].in_flight = endpoints[3].in_flight = 1
    assert place(endpoints, prompt_tokens=9_600, sessions=[4, 4, 0, 3]) == 2
    assert place(endpoints, prompt_tokens=9_600, sessions=[4, 4, 4, 3]) == 3


def test_a_new_session_avoids_a_queue_longer_than_the_turn_elsewhere_and_counts_speed() -> None:
    endpoints = views(8_000, 8_000, 8_000)
    assert place(endpoints, prompt_tokens=9_600, sessions=[0, 2, 3], queued_tokens=[2_000, 0, 0]) == 1
    endpoints[1].busy = True
    assert place(endpoints, prompt_tokens=9_600, sessions=[0, 2, 3], queued_tokens=[2_000, 0, 0]) == 2
    # a replica twice as slow holding 1 session: (1 + 1) * 2 = 4 against (2 + 1) * 1 = 3
    assert place(views(8_000, 8_000), prompt_tokens=9_600, sessions=[1, 2], speed=[2.0, 1.0]) == 1
    assert place(views(8_000, 8_000), prompt_tokens=9_600, sessions=[0, 2], speed=[2.0, 1.0]) == 0
    assert place(views(8_000, 8_000), prompt_tokens=9_600, sessions=[1, 2], speed=[1.2, 1.0]) == 0  # within noise: as fast


def test_equal_new_sessions_spread_by_their_identity() -> None:
    chosen = {place(views(8_000, 8_000, 8_000), prompt_tokens=9_600, identity=n) for n in range(40)}
    assert chosen == {0, 1, 2}


def _endpoint(prior_ms: float, *streams_ms: float, at: float = 0.0, rate: PrefillRate | None = None) -> SimpleNamespace:
    itl = ItlEstimate(prior_ms=prior_ms)
    for ms in streams_ms:
        itl.observe(ms)
    return SimpleNamespace(itl=itl, itl_observed_at=at if streams_ms else None, prefill_rate=rate or PrefillRate())


def test_speeds_compare_measured_endpoints_only_with_each_other() -> None:
    """A loaded host measures every stream slower than the prior: an endpoint measured
    against one not yet measured is not slower (cold start, one replica warmed first),
    and two measured endpoints are compared by their measurements."""
    warmed, cold = _endpoint(5.0, 20.0, 20.0, 20.0), _endpoint(5.0)
    assert relative_speeds([warmed, cold], now=0.0) == [1.0, 1.0]
    assert relative_speeds([warmed, _endpoint(5.0, 20.0)], now=0.0) == [1.0, 1.0]  # one stream is not yet evidence
    fast, slow = _endpoint(5.0, 10.0, 10.0, 10.0), _endpoint(5.0, 30.0, 30.0, 30.0)
    assert relative_speeds([fast, slow, cold], now=0.0) == [0.5, 1.5, 1.0]


def _rate(*first_tokens: tuple[float, float, int]) -> PrefillRate:
    """A prefill rate fed (sent at, first token at, work tokens) per attempt."""
    rate = PrefillRate()
    for n, (sent, first, work) in enumerate(first_tokens):
        rate.sent(n, at=sent, work_tokens=work)
        rate.prefilled(n, now=first)
    return rate


def test_the_prefill_rate_measures_first_tokens_and_bounds_the_rate_by_a_prefill_still_running() -> None:
    rate = _rate((0.0, 0.1, 2_000))  # 100 ms for 2 000 tokens of work
    assert rate.ms_per_token(now=1.0) == 0.05 and rate.observations == 1
    rate.sent("late", at=1.0, work_tokens=2_000)
    assert rate.ms_per_token(now=1.05) == 0.05  # within what it measured: the mean stands
    assert rate.ms_per_token(now=2.0) == 0.5  # a second in, no first token yet: at least 10x slower
    rate.dropped("late")
    assert rate.ms_per_token(now=3.0) == 0.05
    rate.sent("tiny", at=3.0, work_tokens=100)  # too small to measure: its fixed part dominates
    assert not rate.waiting
    rate.sent("noisy", at=3.0, work_tokens=2_000)
    rate.prefilled("noisy", now=3.15)  # 1.5x: averaged
    assert rate.ms_per_token(now=4.0) == pytest.approx(0.0625)
    rate.sent("slowed", at=4.0, work_tokens=2_000)
    rate.prefilled("slowed", now=5.0)  # 8x: a step change, taken at once
    assert rate.ms_per_token(now=5.0) == 0.5


def test_a_replica_that_slows_down_is_slow_while_its_first_prefill_overruns_before_any_stream_ends() -> None:
    """Four replicas measured alike (streams and first tokens); the fourth's prefill sent
    at t=10 has no first token 0.6 s later, where its 1 600 tokens took 80 ms before."""
    def replica() -> SimpleNamespace:
        return _endpoint(5.0, 4.0, 4.0, 4.0, at=9.0, rate=_rate((8.0, 8.08, 1_600), (8.5, 8.58, 1_600), (9.0, 9.08, 1_600)))

    endpoints = [replica() for _ in range(4)]
    assert relative_speeds(endpoints, now=10.6) == [1.0] * 4
    endpoints[3].prefill_rate.sent("slowed", at=10.0, work_tokens=1_600)
    assert relative_speeds(endpoints, now=10.1) == [1.0] * 4  # within noise yet
    speeds = relative_speeds(endpoints, now=10.6)
    assert speeds[:3] == [1.0] * 3 and 7.0 < speeds[3] < 8.0  # 600 ms for 80 ms of work
    # and such a speed sends its session's turn away from home, to a whole prefill elsewhere
    turn = place(views(28_400, 8_000, 8_000, 28_400)[::-1], home=0, sessions=[4, 4, 4, 4], speed=speeds[::-1])
    assert turn != 0


def test_a_home_whose_queue_fills_up_keeps_no_turn_past_the_whole_prompt_uncached_elsewhere() -> None:
    """The 25% slack never keeps a turn past what the whole prompt costs uncached on an
    idle endpoint: home's 34 000 tokens of work (queue and turn) against a 30 000-token
    prompt that no other endpoint holds any of."""
    endpoints = views(28_400, 0, 0)
    assert place(endpoints, home=0, queued_tokens=[32_400, 0, 0]) != 0
    assert place(endpoints, home=0, queued_tokens=[28_000, 0, 0]) == 0  # 29 600: within it


def test_a_home_measured_slow_keeps_a_turn_only_while_it_is_no_dearer_than_anywhere_else() -> None:
    """A slow replica's speed is measured low (a host's own overhead is in every
    endpoint's numbers), so the 25% slack that keeps equal replicas' sessions home does
    not keep a turn on one measured slower: 6.5 x 1 600 = 10 400 tokens' time at home,
    9 600 elsewhere."""
    endpoints = views(16_000, 8_000, 8_000)
    assert place(endpoints, home=0, prompt_tokens=17_600, speed=[6.5, 1.0, 1.0]) != 0
    assert place(endpoints, home=0, prompt_tokens=17_600, speed=[5.5, 1.0, 1.0]) == 0
    assert place(endpoints, home=0, prompt_tokens=17_600, queued_tokens=[2_000, 0, 0]) == 0  # as fast: the slack holds


def test_a_measured_slowness_fades_so_a_replica_no_turn_reaches_is_tried_again() -> None:
    slowed = _endpoint(5.0, 40.0, 40.0, 40.0, at=10.0)
    peers = [_endpoint(5.0, 4.0, 4.0, 4.0, at=40.0) for _ in range(3)]
    assert relative_speeds([*peers, slowed], now=10.0)[3] == 10.0
    assert relative_speeds([*peers, slowed], now=40.0)[3] == 5.5  # halved every 30 s
    later = relative_speeds([*peers, slowed], now=130.0)[3]
    assert 1.5 < later < 1.6
    # a new session goes where sessions are fewest once the slowness has faded, not before
    new = {"prompt_tokens": 9_600, "sessions": [4, 4, 4, 1]}
    assert place(views(8_000, 8_000, 8_000, 8_000), speed=[1.0, 1.0, 1.0, 10.0], **new) != 3
    assert place(views(8_000, 8_000, 8_000, 8_000), speed=[1.0, 1.0, 1.0, later], **new) == 3


def test_a_session_placed_anew_never_goes_where_its_turn_would_cost_more_than_a_whole_prefill() -> None:
    """A session whose home is gone is placed by session balance, but not on a replica
    holding few sessions because it is 5.5x slower: 22 000 uncached tokens there cost
    121 000 tokens' time, four times the whole 30 000-token prompt elsewhere."""
    assert place(views(8_000, 8_000, 8_000, 8_000), sessions=[5, 5, 5, 0], speed=[1.0, 1.0, 1.0, 5.5]) != 3
    assert place(views(8_000, 8_000, 8_000, 8_000), sessions=[5, 5, 5, 0], speed=[1.0, 1.0, 1.0, 1.0]) == 3


def test_a_session_turn_is_no_half_open_endpoint_s_trial_unless_it_is_the_cheapest_there() -> None:
    """A latency ejection's trial must not be a session's latency-sensitive turn moved off
    its cache: the endpoint on trial is compared by its work like any other."""
    endpoints = views(28_400, 8_000, 8_000, 8_000)
    endpoints[3].trial = True
    assert place(endpoints, home=0) == 0  # home holds the history: no trial for this turn
    assert place(endpoints, prompt_tokens=9_600, sessions=[4, 4, 4, 4]) != 3  # slowed before: 10x
    new = {"prompt_tokens": 9_600, "sessions": [4, 4, 4, 0]}
    assert place(endpoints, speed=[1.0, 1.0, 1.0, 10.0], **new) != 3
    assert place(endpoints, **new) == 3  # as fast as the rest now: the fewest sessions take it
    assert place(endpoints, trial_first=False, **new) != 3


def test_a_turn_leaving_home_crowds_no_endpoint_past_home_for_less_than_a_whole_prefill() -> None:
    """Unequal replicas: a session leaves a busy home only for an endpoint no more crowded
    than home, or when staying would cost more than the whole prompt uncached."""
    endpoints = views(11_200, 8_000, 8_000, 8_000)
    # home: 4 500 queued + 1 600 of its own against 4 800 elsewhere (5 000 on endpoint 2)
    queued = [4_500, 0, 200, 0]
    assert place(endpoints, home=0, prompt_tokens=12_800, sessions=[4, 5, 3, 6], queued_tokens=queued) == 2
    assert place(endpoints, home=0, prompt_tokens=12_800, sessions=[4, 5, 4, 6], queued_tokens=queued) == 0
    # a home twice as slow holding 2 other sessions (3 with this one: 6 per unit of speed)
    # sends it where it makes 5, never to where it would make a sixth
    slow_home = {"home": 0, "prompt_tokens": 12_800, "speed": [2.0, 1.0, 1.0, 1.0]}
    assert place(endpoints, sessions=[2, 5, 5, 4], queued_tokens=[1_000, 0, 0, 0], **slow_home) == 3
    assert place(endpoints, sessions=[2, 5, 5, 5], queued_tokens=[1_000, 0, 0, 0], **slow_home) == 0
    # a queue at home past the whole prompt: it leaves for the least crowded of those close
    queued = [12_000, 0, 200, 0]
    assert place(endpoints, home=0, prompt_tokens=12_800, sessions=[4, 5, 6, 6], queued_tokens=queued) == 1
