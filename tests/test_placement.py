"""Session placement on plain data: which conversation a prompt belongs to, how many
each endpoint holds, and where a conversation's turn goes (issue 21)."""

from __future__ import annotations

from types import SimpleNamespace

from latgate.live.providers.predictor import ItlEstimate
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


def _endpoint(prior_ms: float, *streams_ms: float) -> SimpleNamespace:
    itl = ItlEstimate(prior_ms=prior_ms)
    for ms in streams_ms:
        itl.observe(ms)
    return SimpleNamespace(itl=itl)


def test_speeds_compare_measured_endpoints_only_with_each_other() -> None:
    """A loaded host measures every stream slower than the prior: an endpoint measured
    against one not yet measured is not slower (cold start, one replica warmed first),
    and two measured endpoints are compared by their measurements."""
    warmed, cold = _endpoint(5.0, 20.0, 20.0, 20.0), _endpoint(5.0)
    assert relative_speeds([warmed, cold]) == [1.0, 1.0]
    assert relative_speeds([warmed, _endpoint(5.0, 20.0)]) == [1.0, 1.0]  # one stream is not yet evidence
    fast, slow = _endpoint(5.0, 10.0, 10.0, 10.0), _endpoint(5.0, 30.0, 30.0, 30.0)
    assert relative_speeds([fast, slow, cold]) == [0.5, 1.5, 1.0]
