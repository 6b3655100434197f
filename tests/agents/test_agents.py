"""Real coding agents complete a turn through latgate: Codex (Responses API), Cline and
Qwen Code (chat completions), Claude Code (Anthropic Messages).

Each test installs its CLI from the npm registry into the agents cache (pinned, once;
see ``tests/agents/install.py``), starts latgate in front of three simulated providers,
and runs one non-interactive turn in a scratch HOME and working folder. The simulator
answers the prompt with a call to the agent's shell tool and the tool's result with
text, so a turn is: request -> tool call -> the agent runs it -> request carrying the
result -> text -> exit 0. Skipped where ``node``/``npm`` are missing.

Each test also checks the session identity the CLI sends (``agents/identity.py``,
docs/clients.md "Session identity"): Codex and Claude Code resume their session for a
second turn and must carry one identity on every request of both; Cline and Qwen Code
send none to an OpenAI-compatible server, so their identity is the prompt prefix, which
each later request must resend unchanged.
"""

from __future__ import annotations

import concurrent.futures

import pytest
from agents.identity import UUID, session_identity, user_id_session
from agents.install import PINS, AgentUnavailable, install, node_missing
from agents.recorder import describe
from agents.run import run_agent
from agents.sandbox import Sandbox
from agents.setups import SETUPS
from agents.turn import AgentStack, Turn, agent_stack, run_turn, timing

#: A cold cache installs all four CLIs inside the first test (about a minute, at most
#: INSTALL_TIMEOUT_SECONDS); each turn is bounded by TURN_TIMEOUT_SECONDS on its own.
pytestmark = [pytest.mark.agents, pytest.mark.timeout(600)]

TURN_TIMEOUT_SECONDS = 120


@pytest.fixture(scope="module")
def installed() -> dict[str, str]:
    """Install every pinned CLI at once (in parallel on a cold cache); agent -> error."""
    reason = node_missing()
    if reason:
        pytest.skip(reason)
    errors: dict[str, str] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(PINS)) as pool:
        futures = {name: pool.submit(install, pin) for name, pin in PINS.items()}
        for name, future in futures.items():
            try:
                future.result()
            except AgentUnavailable as exc:
                errors[name] = str(exc)
    return errors


def _turn(
    agent: str, installed: dict[str, str], tmp_path, *, model: str, follow_up: bool = False
) -> tuple[Turn, AgentStack, dict]:
    assert agent not in installed, installed.get(agent)
    with agent_stack() as stack:
        turn = run_turn(
            agent,
            stack=stack,
            root=tmp_path,
            model=model,
            timeout_seconds=TURN_TIMEOUT_SECONDS,
            follow_up=follow_up,
        )
        totals = stack.requests_total()
    return turn, stack, totals


def _assert_completed(turn: Turn, stack: AgentStack, totals: dict, *, provider: str, path: str) -> None:
    report = f"{turn.run.summary()}\n--- sent to latgate\n{describe(turn.seen)}"
    assert turn.run.returncode == 0, report
    model_requests = [r for r in turn.seen if r.method == "POST" and r.path == path]
    assert model_requests, report
    received = [r.body for r in stack.sims[provider].stats.received if isinstance(r.body, dict)]
    tool_results = [b for b in received if b.get("messages") and b["messages"][-1].get("role") == "tool"]
    assert tool_results, f"no request carrying a tool result reached {provider}\n{report}"
    assert totals.get((provider, "200"), 0) >= len(model_requests), f"{totals}\n{report}"
    elsewhere = {key: n for key, n in totals.items() if key[0] != provider and n}
    assert not elsewhere, f"requests measured under other providers: {elsewhere}\n{report}"
    result = str(tool_results[0]["messages"][-1].get("content"))[:120].replace("\n", " ")
    print(f"\n[{turn.agent}] {timing(turn)}; {len(model_requests)} model requests via {provider}")
    print(f"{describe(turn.seen)}\ntool result sent back: {result}")


def _model_requests(turn: Turn, path: str) -> list:
    return [r for r in turn.seen if r.method == "POST" and r.path == path]


def _assert_one_session(turn: Turn, path: str, *, where: str) -> str:
    """Every model request of both turns carries the same identity, found at ``where``."""
    requests = _model_requests(turn, path)
    identities = {session_identity(r) for r in requests}
    report = f"{identities}\n{describe(turn.seen)}"
    assert len(identities) == 1, report
    (found,) = identities
    assert found is not None and found[0] == where, report
    print(f"[{turn.agent}] session identity: {where} = {found[1]} on all {len(requests)} model requests")
    return found[1]


def _assert_prefix_is_the_identity(turn: Turn, path: str) -> None:
    """No identity is sent; each later request resends the first one's messages as they were."""
    requests = _model_requests(turn, path)
    assert [session_identity(r) for r in requests] == [None] * len(requests), describe(turn.seen)
    first = requests[0].body["messages"]
    for later in requests[1:]:
        assert later.body["messages"][: len(first)] == first, describe(turn.seen)
    print(
        f"[{turn.agent}] no session identity; the first request's {len(first)} messages open all {len(requests)}"
    )


def test_codex_completes_a_turn_through_the_responses_api(installed, tmp_path) -> None:
    turn, stack, totals = _turn("codex", installed, tmp_path, model="glm-5.1", follow_up=True)
    _assert_completed(turn, stack, totals, provider="vllm", path="/v1/responses")
    session = _assert_one_session(turn, "/v1/responses", where="body prompt_cache_key")
    assert {r.headers.get("session-id") for r in _model_requests(turn, "/v1/responses")} == {session}
    assert len(_model_requests(turn, "/v1/responses")) >= 4  # both turns: prompt, tool result each


def test_cline_completes_a_turn_on_the_latency_sensitive_pool(installed, tmp_path) -> None:
    turn, stack, totals = _turn("cline", installed, tmp_path, model="glm-5.1-highspeed")
    _assert_completed(turn, stack, totals, provider="tile-rt", path="/v1/chat/completions")
    _assert_prefix_is_the_identity(turn, "/v1/chat/completions")


def test_qwen_code_completes_a_turn_on_the_upstream_serving_its_model(installed, tmp_path) -> None:
    turn, stack, totals = _turn("qwen", installed, tmp_path, model="qwen2.5-72b-instruct")
    _assert_completed(turn, stack, totals, provider="taotoken", path="/v1/chat/completions")
    _assert_prefix_is_the_identity(turn, "/v1/chat/completions")


def test_claude_code_completes_a_turn_through_the_messages_api(installed, tmp_path) -> None:
    turn, stack, totals = _turn("claude", installed, tmp_path, model="claude-sonnet-4-6", follow_up=True)
    _assert_completed(turn, stack, totals, provider="vllm", path="/v1/messages")
    session = _assert_one_session(turn, "/v1/messages", where="header x-claude-code-session-id")
    assert UUID.match(session), session
    requests = _model_requests(turn, "/v1/messages")
    assert {user_id_session(r.body["metadata"]["user_id"]) for r in requests} == {session}
    assert len(requests) >= 4  # both turns: prompt, tool result each


def test_codex_sandbox_as_configured_keeps_writes_inside_the_working_folder(installed, tmp_path) -> None:
    assert "codex" not in installed, installed.get("codex")
    sandbox = Sandbox.create(tmp_path)
    outside = tmp_path / "outside.txt"
    setup = SETUPS["codex"](sandbox, command=install(PINS["codex"]), base_url="http://127.0.0.1:9", model="m")
    script = f"touch inside.txt; touch {outside}; touch {sandbox.tmp}/t.txt; true"
    run = run_agent(
        [setup.turn[0], "sandbox", "-c", 'sandbox_mode="workspace-write"', "--", "sh", "-c", script],
        sandbox=sandbox,
        env=sandbox.env(setup.env),
        timeout_seconds=TURN_TIMEOUT_SECONDS,
    )
    assert run.returncode == 0, run.summary()
    assert (sandbox.work / "inside.txt").exists(), run.summary()
    assert not outside.exists() and not (sandbox.tmp / "t.txt").exists(), run.summary()
