"""Sessions, the prefix index and cache-aware prediction on plain data: session keys
from what agents send, the index's matches and bounds, and the selector over a live
pool on an injected clock, each endpoint's engine modelled by the test (a prefix cache
that holds what it served, and prefill at a fixed cost per uncached token)."""

from __future__ import annotations

import collections
import random

from clocks import ManualClock

from latgate.foundation.config import load_config_text
from latgate.foundation.metrics import Metrics
from latgate.live.providers import ProviderPool
from latgate.live.store.sessions import LocalSessionMap
from latgate.routing.decision import Router
from latgate.routing.prefix_index import MAX_PROMPT_SAMPLES, MIN_ENTRY_TOKENS, PrefixIndex, prompt_prefix
from latgate.routing.selection import Selector
from latgate.routing.sessions import claude_code_session, session_key
from latgate.routing.tokens import estimate_prompt_tokens

PER_TOKEN_MS = 0.1
"""The modelled engines' prefill: 30 000 uncached tokens cost 3 s."""


# -- session keys -------------------------------------------------------------------------


def test_session_key_takes_the_first_present_source_in_order() -> None:
    user_id = "user_5dd07c33_account__session_d2e70091-3007-41a3-a916-cb8b0d3098de"
    sources = [
        ({"prompt_cache_key": "k"}, {"x-claude-code-session-id": "a", "x-session-id": "z"}),
        ({}, {"x-claude-code-session-id": "a", "session-id": "b"}),
        ({}, {"session-id": "b", "x-codex-session-id": "c"}),
        ({"user": user_id}, {"x-session-id": "z"}),
        ({}, {"x-session-id": "z"}),
    ]
    keys = [session_key(body, headers) for body, headers in sources]
    assert None not in keys and len(set(keys)) == len(keys)
    assert keys[0] == session_key({"prompt_cache_key": "k"}, {})
    assert keys[1] == session_key({}, {"x-claude-code-session-id": "a"})
    assert keys[3] == session_key({"metadata": {"user_id": user_id}}, {}) == session_key({}, {"x-session-id": "d2e70091-3007-41a3-a916-cb8b0d3098de"})
    assert session_key({"user": "alice"}, {}) is None and session_key({}, {"session-id": ""}) is None


def test_opencode_and_qwen_code_sessions_are_recognised_in_their_place_in_the_order() -> None:
    opencode = session_key({}, {"x-opencode-session": "ses_1"})
    qwen = session_key({"metadata": {"sessionId": "ses_1", "promptId": "p-7"}}, {})
    assert opencode is not None and opencode == qwen == session_key({}, {"x-session-id": "ses_1"})
    assert session_key({}, {"x-claude-code-session-id": "a", "x-opencode-session": "b"}) == session_key({}, {"x-claude-code-session-id": "a"})
    assert session_key({}, {"x-opencode-session": "b", "session-id": "c"}) == session_key({}, {"x-opencode-session": "b"})
    assert session_key({"metadata": {"sessionId": "q"}}, {"x-session-id": "z"}) == session_key({}, {"x-session-id": "q"})
    assert session_key({"metadata": {"sessionId": 7}}, {}) is None and session_key({"metadata": {"sessionId": ""}}, {}) is None
    assert session_key({}, {"x-continue-unique-id": "install-1"}) is None, "one id per installation is no session"


def test_claude_code_user_id_gives_its_session_in_both_formats() -> None:
    assert claude_code_session("user_ab12_account_5e0c_session_9f3d") == "9f3d"
    assert claude_code_session("user_ab12_account__session_9f3d") == "9f3d"
    assert claude_code_session('{"device_id": "ab12", "account_uuid": "", "session_id": "9f3d"}') == "9f3d"
    assert claude_code_session("user_ab12") is None and claude_code_session("{not json") is None


def test_the_session_map_is_bounded_and_forgets_the_least_recently_used() -> None:
    sessions = LocalSessionMap(max_sessions=2)
    sessions.put(1, "a")
    sessions.put(2, "b")
    sessions.put(1, "a")  # 1 used again: 2 is the oldest
    sessions.put(3, "c")
    assert (sessions.get(1), sessions.get(2), sessions.get(3), len(sessions)) == ("a", None, "c", 2)


# -- the prefix index -------------------------------------------------------------------


def turn_body(history: list[dict], *, system: str = "You are a coding agent. " * 200) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": system}, *history]}


def history(turns: int, *, name: str = "s", chars: int = 4000) -> list[dict]:
    messages: list[dict] = []
    for n in range(turns):
        messages.append({"role": "user", "content": f"{name} turn {n}: " + "x" * chars})
        messages.append({"role": "assistant", "content": f"{name} answer {n}"})
    return messages


def test_a_session_s_next_turn_matches_its_whole_previous_prompt_but_no_more() -> None:
    index = PrefixIndex()
    before = prompt_prefix(turn_body(history(3)), prompt_tokens=estimate_prompt_tokens(turn_body(history(3))))
    after = prompt_prefix(turn_body(history(4)), prompt_tokens=estimate_prompt_tokens(turn_body(history(4))))
    assert before is not None and after is not None
    index.record(before)
    matched = index.longest_match_tokens(after)
    assert 0.8 * before.total_tokens <= matched <= 1.05 * before.total_tokens < after.total_tokens
    other = prompt_prefix(turn_body(history(4, name="t")), prompt_tokens=after.total_tokens)
    system_tokens = len(turn_body([])["messages"][0]["content"]) // 4
    assert other is not None and 0 < index.longest_match_tokens(other) <= 1.1 * system_tokens  # the system prompt only


def test_prompt_samples_keep_no_text_and_are_bounded() -> None:
    secret = "the user's private source code " * 5000
    prefix = prompt_prefix({"messages": [{"role": "user", "content": secret * 40}]}, prompt_tokens=10**6)
    assert prefix is not None and len(prefix.keys) <= MAX_PROMPT_SAMPLES
    assert "private" not in repr(prefix)


def test_the_index_ages_out_the_least_recently_used_within_its_capacity() -> None:
    index = PrefixIndex(capacity_tokens=3000)
    old, kept = (prompt_prefix(turn_body(history(2, name=n)), prompt_tokens=2000) for n in ("old", "kept"))
    assert old is not None and kept is not None
    index.record(old)
    index.record(kept)
    assert index.held_tokens <= 3000 and index.longest_match_tokens(kept) == kept.total_tokens
    assert index.longest_match_tokens(old) < old.total_tokens
    tiny = PrefixIndex(capacity_tokens=10 * MIN_ENTRY_TOKENS)
    for n in range(100):
        sample = prompt_prefix({"messages": [{"role": "user", "content": str(n)}, {"role": "user", "content": "x"}]}, prompt_tokens=3)
        assert sample is not None
        tiny.record(sample)
    assert tiny.entries <= 10


# -- cache-aware choice over a live pool ---------------------------------------------------

CONFIG = """
[providers.pool]
endpoints = ["http://a:1/v1", "http://b:1/v1"]
connector = "vllm"
models = ["m"]
"""


class Engines:
    """Two endpoints and their engines: each holds every prompt it served (whole
    messages) and prefills the rest at ``PER_TOKEN_MS``, one request after another (a
    request held in flight is prefilled before those sent after it)."""

    def __init__(self, *, base_ms: dict[str, float] | None = None, extra: str = "") -> None:
        self.config = load_config_text(CONFIG + extra, source="test.toml")
        self.clock = ManualClock()
        self.pool = ProviderPool(self.config, metrics=Metrics(providers=self.config.providers, models=[]), env={}, clock=self.clock)
        self.router = Router(self.config)
        self.selector = Selector(config=self.config, pool=self.pool, rng=random.Random(1))
        self.base_ms = base_ms or {"pool-0": 20.0, "pool-1": 20.0}
        self.served: dict[str, list[list[str]]] = {"pool-0": [], "pool-1": []}
        self.held: list[tuple] = []

    def true_cached_tokens(self, endpoint: str, contents: list[str]) -> int:
        best = 0
        for prompt in self.served[endpoint]:
            common = 0
            for mine, theirs in zip(contents, prompt, strict=False):
                if mine != theirs:
                    break
                common += len(mine) // 4
            best = max(best, common)
        return best

    def send(self, body: dict, *, headers: dict[str, str] | None = None, hold: bool = False) -> str:
        """Route ``body`` and serve it; ``hold``: it stays in flight (prefilling) until
        :meth:`release_all`. Returns the endpoint id."""
        decision = self.router.decide(body, headers or {})
        plan = self.selector.plan(decision, body)
        runtime, endpoint = self.pool["pool"], plan.endpoint
        name = endpoint.config.id
        contents = [m["content"] for m in body["messages"]]
        self.pool.release(endpoint)
        queue_ms = endpoint.queue_ms(self.clock())
        ticket = self.pool.begin(runtime, endpoint, prompt_tokens=plan.prompt_tokens, queue_ms=queue_ms, prefix=plan.prompt_prefix)
        uncached = sum(len(c) // 4 for c in contents) - self.true_cached_tokens(name, contents)
        self.served[name].append(contents)
        ahead = sum(PER_TOKEN_MS * tokens for held_endpoint, _, tokens in self.held if held_endpoint is endpoint)
        ttft_ms = ahead + self.base_ms[name] + PER_TOKEN_MS * uncached
        if hold:
            self.held.append((endpoint, (runtime, ticket, ttft_ms), uncached))
            return name
        self.clock.now += 0.01
        self.pool.record_first_token(runtime, endpoint, ticket, ttft_ms=ttft_ms)
        self.pool.record_outcome(runtime, endpoint, ok=True, ticket=ticket)
        self.pool.end(runtime, endpoint, ticket)
        return name

    def release(self, held: list[tuple]) -> None:
        """Report the first tokens of ``held`` (some of :attr:`held`) and end them."""
        for entry in held:
            endpoint, (runtime, ticket, ttft_ms), _ = entry
            self.pool.record_first_token(runtime, endpoint, ticket, ttft_ms=ttft_ms)
            self.pool.end(runtime, endpoint, ticket)
            self.held.remove(entry)

    def release_all(self) -> None:
        self.release(list(self.held))

    def warm(self) -> None:
        """Measure both endpoints on prompts of several sizes, sharing nothing."""
        for n in range(12):
            self.send({"model": "m", "messages": [{"role": "user", "content": f"warm {n} " + "w" * (400 * (n % 4 + 1))}]})


def test_a_session_stays_on_the_endpoint_holding_its_history_while_it_is_faster_for_it() -> None:
    """pool-0 is slower for a fresh prompt (60 ms against 20 ms) but holds the session:
    prefilling its 30k-token history elsewhere would cost seconds."""
    engines = Engines(base_ms={"pool-0": 60.0, "pool-1": 20.0})
    engines.warm()
    home = engines.send(turn_body(history(1, chars=120_000)), headers={"x-claude-code-session-id": "s1"})
    places = [engines.send(turn_body(history(turn, chars=120_000)), headers={"x-claude-code-session-id": "s1"}) for turn in range(2, 7)]
    assert places == [home] * 5


def test_a_session_moves_when_the_prefill_queued_on_its_endpoint_makes_another_faster() -> None:
    engines = Engines()
    engines.warm()
    headers = {"x-claude-code-session-id": "s1"}
    home = engines.send(turn_body(history(2)), headers=headers)
    assert engines.send(turn_body(history(3)), headers=headers) == home
    giant = {"model": "m", "messages": [{"role": "user", "content": "g" * 400_000}]}  # 100k tokens: 10 s of prefill
    while engines.send(giant, hold=True) != home:
        pass
    assert engines.send(turn_body(history(4)), headers=headers) != home
    engines.release_all()


def test_headerless_sessions_sharing_a_system_prompt_spread_yet_each_stays() -> None:
    """Four agent sessions without session headers, one system prompt, their turns
    overlapping (each sent while the one before it is still prefilling, in a different
    order each round): they share the endpoints, and from its second turn on (when its
    history outweighs one prefill queued ahead) every turn of a session lands where its
    history is."""
    engines = Engines()
    engines.warm()
    places: dict[int, list[str]] = collections.defaultdict(list)
    order = random.Random(3)
    for turn in range(1, 7):
        for session in order.sample(range(4), 4):
            previous = list(engines.held)
            places[session].append(engines.send(turn_body(history(turn, name=f"s{session}", chars=8000)), hold=True))
            engines.release(previous)
    engines.release_all()
    assert {places[s][-1] for s in range(4)} == {"pool-0", "pool-1"}, places
    assert all(len(set(places[s][1:])) == 1 for s in range(4)), places  # a first turn's history is small: it may move once


def test_identical_replicas_split_conversations_that_share_nothing_evenly() -> None:
    engines = Engines()
    engines.warm()
    counts = collections.Counter(
        engines.send({"model": "m", "messages": [{"role": "system", "content": f"agent {n}"}, {"role": "user", "content": "go"}]})
        for n in range(200)
    )
    assert 80 <= counts["pool-0"] <= 120, counts


def test_enable_prefix_cache_false_turns_it_off() -> None:
    engines = Engines(extra="enable_prefix_cache = false\n")
    assert all(ep.prefix_index is None for ep in engines.pool["pool"].endpoints)
    decision = engines.router.decide(turn_body(history(2)), {"x-claude-code-session-id": "s1"})
    assert decision.session_key is None
    assert engines.selector.plan(decision, turn_body(history(2))).prompt_prefix is None


def test_a_malformed_prompt_gives_samples_or_none_never_an_error() -> None:
    odd_role = {"messages": [{"role": ["user"], "content": "hi"}, {"role": {"a": 1}, "content": "x"}]}
    assert prompt_prefix(odd_role, prompt_tokens=10) is not None
    deep: object = "x"
    for _ in range(300):
        deep = [deep]
    assert prompt_prefix({"messages": [{"role": "user", "content": deep}, {"role": "user", "content": "x"}]}, prompt_tokens=10) is None
    calls = {"messages": [{"role": "assistant", "content": None, "tool_calls": [deep]}, {"role": "user", "content": "x"}]}
    assert prompt_prefix(calls, prompt_tokens=10) is None


def test_headerless_new_sessions_are_placed_by_balance_not_where_the_system_prompt_is() -> None:
    """Without session headers the endpoint holding the longest prefix is a turn's home;
    a new session's longest prefix is the shared system prompt, which early on only the
    endpoint that served the first session holds: that is nobody's home, and new
    sessions spread by balance instead of all following the first."""
    engines = Engines()
    engines.warm()
    system = "You are a coding agent. " * 2_000  # 12k tokens: a prefill elsewhere costs far more than 25%
    firsts = [engines.send(turn_body(history(1, name=f"s{n}", chars=2_000), system=system)) for n in range(4)]
    assert collections.Counter(firsts) == {"pool-0": 2, "pool-1": 2}, firsts
