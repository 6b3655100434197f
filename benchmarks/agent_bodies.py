"""Deterministic agent-sized request bodies for the overhead benchmark: what a coding
agent (Cline, Claude Code, Codex) sends on every turn.

- :func:`chat_body`: a ~100 KB chat completions request: a long system prompt (rules,
  tool-use instructions, an environment listing), 25 tool schemas and a history of
  user turns, assistant tool calls and tool results (file contents, command output);
- :func:`messages_body`: an Anthropic ``/v1/messages`` request of similar size with
  12 tools (``input_schema``), a system prompt as text blocks and ``tool_use`` /
  ``tool_result`` blocks in the history.

Every call returns the same bytes (no randomness, no clock), so runs compare.
"""

from __future__ import annotations

import json

_RULES = (
    "You are a senior software engineer working in the user's repository through tools. "
    "Read before you write; keep changes small and reviewed; never invent file contents. "
    "When a command fails, read its output and fix the cause instead of retrying blindly. "
)

_SOURCE = '''def handle(request, *, path):
    """Proxy one request and return the response."""
    body = await read_json_object(request, max_bytes=LIMIT)
    if not isinstance(body.get("messages"), list):
        raise InvalidRequest("'messages' is required", param="messages")
    decision = router.decide(body, request.headers)
    return await forwarder.forward(decision=decision, body=body, path=path)
'''


def _system_prompt(chars: int) -> str:
    parts = ["# Rules\n"]
    i = 0
    while sum(map(len, parts)) < chars:
        parts.append(f"{i + 1}. {_RULES}(rule {i + 1} of the project's style guide)\n")
        if i % 7 == 6:
            parts.append(f"\n## Environment {i}\n- cwd: /home/dev/project/src/module_{i}\n- shell: bash\n")
        i += 1
    return "".join(parts)[:chars]


def _tool(i: int, *, anthropic: bool) -> dict:
    properties = {
        f"param_{j}": {
            "type": "string" if j % 3 else "integer",
            "description": f"Parameter {j} of tool {i}: the path, pattern or count it acts on, as the user named it.",
        }
        for j in range(6)
    }
    schema = {"type": "object", "properties": properties, "required": ["param_0", "param_1"]}
    description = f"Tool {i}: " + "Runs one step of the agent's work in the repository and returns its output. " * 4
    if anthropic:
        return {"name": f"tool_{i}", "description": description, "input_schema": schema}
    return {"type": "function", "function": {"name": f"tool_{i}", "description": description, "parameters": schema}}


def chat_body(model: str, *, stream: bool, target_bytes: int = 100_000) -> bytes:
    """A Cline-like chat completions body of about ``target_bytes`` (compact JSON)."""
    tools = [_tool(i, anthropic=False) for i in range(25)]
    messages: list[dict] = [{"role": "system", "content": _system_prompt(30_000)}]
    turn = 0
    while True:
        messages.append({"role": "user", "content": f"Step {turn}: fix the failing test in module_{turn}.py"})
        call_id = f"call_{turn:04d}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": f"tool_{turn % 25}", "arguments": json.dumps({"param_0": f"src/module_{turn}.py", "param_1": "def "})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": _SOURCE * 4})
        body = {"model": model, "messages": messages, "tools": tools, "stream": stream}
        raw = json.dumps(body, separators=(",", ":")).encode()
        if len(raw) >= target_bytes:
            return raw
        turn += 1


def messages_body(model: str, *, stream: bool, target_bytes: int = 100_000) -> bytes:
    """A Claude-Code-like ``/v1/messages`` body of about ``target_bytes`` with 12 tools."""
    tools = [_tool(i, anthropic=True) for i in range(12)]
    system = [{"type": "text", "text": _system_prompt(30_000)}]
    messages: list[dict] = []
    turn = 0
    while True:
        messages.append({"role": "user", "content": [{"type": "text", "text": f"Step {turn}: fix module_{turn}.py"}]})
        tool_id = f"toolu_{turn:04d}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Reading the file first."},
                    {"type": "tool_use", "id": tool_id, "name": f"tool_{turn % 12}", "input": {"param_0": f"src/module_{turn}.py"}},
                ],
            }
        )
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": _SOURCE * 4}]})
        body = {"model": model, "max_tokens": 4096, "system": system, "messages": messages, "tools": tools, "stream": stream}
        raw = json.dumps(body, separators=(",", ":")).encode()
        if len(raw) >= target_bytes:
            return raw
        turn += 1
