"""The simulator option real-agent tests rely on: ``preferred_tools`` steers which offered
tool the simulated model calls."""

from __future__ import annotations

import pytest

from latgate.commands.sim.replies import plan_chat


def _tool(name: str) -> dict:
    schema = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


BODY = {
    "messages": [{"role": "user", "content": "list the files"}],
    "tools": [_tool("agent"), _tool("run_shell_command")],
}


def _called(body: dict, preferred: tuple[str, ...]) -> str:
    (plan,) = plan_chat(
        body, rng_seed=b"0", default_max_tokens=8, max_output_tokens=64, preferred_tools=preferred
    )
    assert plan.tool_call is not None
    return plan.tool_call.name


def test_preferred_tool_is_called_when_offered() -> None:
    assert _called(BODY, ("Bash", "run_shell_command")) == "run_shell_command"


@pytest.mark.parametrize("preferred", [(), ("Bash",)])
def test_first_tool_is_called_when_no_preferred_tool_is_offered(preferred: tuple[str, ...]) -> None:
    assert _called(BODY, preferred) == "agent"


def test_tool_choice_naming_a_function_wins_over_preferred_tools() -> None:
    body = {**BODY, "tool_choice": {"type": "function", "function": {"name": "agent"}}}
    assert _called(body, ("run_shell_command",)) == "agent"
