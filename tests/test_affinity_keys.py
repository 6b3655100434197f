"""An explicit client key (``prompt_cache_key``, or a Claude Code / Codex session header)
drives prefix affinity instead of the prompt's first message."""

from __future__ import annotations

import httpx
import pytest
from stack import FAST, gateway, simulators

from latgate.commands.sim import SimOptions
from latgate.foundation.config import load_config_text
from latgate.routing.decision import Router
from latgate.routing.sessions import SESSION_HEADERS
from latgate.routing.sessions import session_key as client_affinity_key

CONFIG = """
[providers.pool]
endpoints = ["{a}/v1", "{b}/v1"]
models = ["m"]
enable_prefix_cache = true
"""


def test_prompt_cache_key_gives_a_stable_key_whatever_the_prompt() -> None:
    first = client_affinity_key({"prompt_cache_key": "repo-1", "messages": [{"content": "a"}]}, {})
    second = client_affinity_key({"prompt_cache_key": "repo-1", "messages": [{"content": "b"}]}, {})
    assert first is not None and first == second
    assert client_affinity_key({"prompt_cache_key": "repo-2"}, {}) != first


def test_prompt_cache_key_wins_over_a_session_header() -> None:
    headers = {"x-claude-code-session-id": "s-1"}
    assert client_affinity_key({"prompt_cache_key": "k"}, headers) == client_affinity_key(
        {"prompt_cache_key": "k"}, {}
    )
    assert client_affinity_key({}, headers) != client_affinity_key({"prompt_cache_key": "k"}, {})


@pytest.mark.parametrize("header", SESSION_HEADERS)
def test_each_session_header_gives_a_key(header: str) -> None:
    assert client_affinity_key({}, {header: "abc"}) == client_affinity_key(
        {}, {"x-claude-code-session-id": "abc"}
    )


@pytest.mark.parametrize("body", [{}, {"prompt_cache_key": ""}, {"prompt_cache_key": 7}])
def test_no_explicit_key_means_none(body: dict) -> None:
    assert client_affinity_key(body, {"session-id": ""}) is None


def test_router_hashes_the_key_only_where_affinity_can_act() -> None:
    two = load_config_text(CONFIG.format(a="http://a:1", b="http://b:1"), source="t.toml", env={})
    one = load_config_text(
        '[providers.p]\napi_base = "http://a:1/v1"\nenable_prefix_cache = true\n', source="t.toml", env={}
    )
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "prompt_cache_key": "secret-session-42",
    }
    decision = Router(two).decide(body, {})
    assert decision.session_key == client_affinity_key(body, {})
    assert "secret-session-42" not in repr(decision)  # hashed, never kept raw
    assert Router(one).decide(body, {}).session_key is None


@pytest.fixture(scope="module")
def pool():
    sims = {name: SimOptions(name=name, models=("m",), **FAST) for name in ("a", "b")}
    with simulators(sims) as running:
        text = CONFIG.format(a=running["a"][0], b=running["b"][0])
        with gateway(text) as stack:
            stack.sims = {name: app for name, (_, app) in running.items()}
            yield stack


def _served(pool, send) -> tuple[int, int]:
    """How many requests each endpoint got while ``send()`` ran."""
    before = [pool.sims[n].stats.requests_total for n in ("a", "b")]
    send()
    after = [pool.sims[n].stats.requests_total for n in ("a", "b")]
    return after[0] - before[0], after[1] - before[1]


def _chat(pool, *, prompt: str, key: str | None = None, headers: dict | None = None) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "go"}],
    }
    if key is not None:
        body["prompt_cache_key"] = key
    r = httpx.post(pool.v1 + "/chat/completions", json=body, headers=headers or {})
    assert r.status_code == 200


def test_same_prompt_cache_key_with_different_prompts_lands_on_one_endpoint(pool) -> None:
    counts = _served(pool, lambda: [_chat(pool, prompt=f"prompt {i}", key="repo-A") for i in range(8)])
    assert sorted(counts) == [0, 8]


@pytest.mark.parametrize("header", ["x-claude-code-session-id", "session-id", "x-codex-session-id"])
def test_same_session_header_with_different_prompts_lands_on_one_endpoint(pool, header: str) -> None:
    counts = _served(
        pool, lambda: [_chat(pool, prompt=f"p{i}", headers={header: "sess-7"}) for i in range(6)]
    )
    assert sorted(counts) == [0, 6]


def test_codex_responses_prompt_cache_key_keeps_its_endpoint(pool) -> None:
    def send() -> None:
        for i in range(6):
            body = {
                "model": "m",
                "input": f"turn {i}",
                "instructions": f"v{i}",
                "prompt_cache_key": "codex-1",
                "store": False,
            }
            assert httpx.post(pool.v1 + "/responses", json=body).status_code == 200

    assert sorted(_served(pool, send)) == [0, 6]


def test_different_keys_spread_over_both_endpoints(pool) -> None:
    a, b = _served(pool, lambda: [_chat(pool, prompt="same prompt", key=f"key-{i}") for i in range(16)])
    assert a > 0 and b > 0 and a + b == 16
