"""The prefix index's walk over real-looking agent bodies: the token estimate it returns
is :func:`estimate_prompt_tokens`'s, and its samples (their character offsets, the
message ends, which samples two prompts share) are the ones pinned below, taken from
the walk before it was made cheaper (issue 21: the index's CPU cost).

The bodies are three sessions' turns: OpenAI chat completions with tools and tool calls
(Cline, Codex on chat), Anthropic Messages with ``tool_use`` / ``tool_result`` blocks and
a system prompt as text blocks (Claude Code), and a Responses API request as routing
sees it (its chat translation)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from latgate.request.translate.responses_request import responses_to_chat
from latgate.routing.prefix_index import estimate_and_sample, prompt_prefix, sample_prompt
from latgate.routing.strategies.placement import conversation_key
from latgate.routing.tokens import estimate_prompt_tokens

_SYSTEM = "You are a coding agent working in the user's repository. Read before you write.\n" * 120
_SOURCE = 'def handle(request):\n    """Proxy one request."""\n    return forward(request)\n' * 40


def _openai_tools() -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"Tool {i}: runs one step of the agent's work. " * 3,
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            },
        }
        for i in range(6)
    ]


def chat_turns(session: str, turns: int) -> list[dict[str, Any]]:
    """An OpenAI chat session's bodies, one per turn, each resending the history."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": _SYSTEM}]
    bodies = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{session} step {turn}: fix module_{turn}.py"})
        bodies.append({"model": "m", "messages": [*messages], "tools": _openai_tools(), "stream": True})
        call_id = f"call_{session}_{turn}"
        arguments = json.dumps({"path": f"src/module_{turn}.py"})
        messages.append(
            {
                "role": "assistant",
                "content": None if turn % 2 else "Reading it first.",
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "tool_1", "arguments": arguments}}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": _SOURCE + f"# {turn}\n"})
    return bodies


def messages_turns(session: str, turns: int) -> list[dict[str, Any]]:
    """An Anthropic Messages session's bodies (Claude Code's shape)."""
    tools = [{"name": f"tool_{i}", "description": "Runs a step.", "input_schema": {"type": "object"}} for i in range(4)]
    messages: list[dict[str, Any]] = []
    bodies = []
    for turn in range(turns):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"{session} step {turn}"}]})
        bodies.append(
            {
                "model": "m",
                "max_tokens": 1024,
                "system": [{"type": "text", "text": _SYSTEM}],
                "tools": tools,
                "messages": [*messages],
            }
        )
        tool_id = f"toolu_{session}_{turn}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Reading the file first."},
                    {"type": "tool_use", "id": tool_id, "name": "tool_0", "input": {"path": f"m{turn}.py"}},
                ],
            }
        )
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": _SOURCE * 3}]}
        )
    return bodies


def responses_turns(session: str, turns: int) -> list[dict[str, Any]]:
    """A Responses API session's bodies as routing sees them (their chat translation)."""
    items: list[dict[str, Any]] = []
    bodies = []
    for turn in range(turns):
        items.append({"role": "user", "content": [{"type": "input_text", "text": f"{session} step {turn}"}]})
        request = {"model": "m", "instructions": _SYSTEM, "input": [*items], "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object"}}
        ]}
        bodies.append(responses_to_chat(request).chat_body)
        call_id = f"fc_{session}_{turn}"
        items.append({"type": "function_call", "call_id": call_id, "name": "shell", "arguments": '{"cmd": "ls"}'})
        items.append({"type": "function_call_output", "call_id": call_id, "output": _SOURCE})
    return bodies


def corpus() -> list[dict[str, Any]]:
    """Every body, each parsed from its JSON as a request body is."""
    bodies = [
        *chat_turns("a", 4),
        *chat_turns("b", 2),
        *messages_turns("c", 4),
        *messages_turns("d", 2),
        *responses_turns("e", 3),
    ]
    edited = chat_turns("a", 4)[-1]
    edited["messages"][3]["content"] = "Reading it again."  # an earlier message changed: shared up to it
    long_user = {"model": "m", "messages": [{"role": "user", "content": _SOURCE * 8}, {"role": "user", "content": "go"}]}
    prompt = {"model": "m", "prompt": _SOURCE}
    return [orjson.loads(orjson.dumps(body)) for body in (*bodies, edited, long_user, prompt)]


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def facts(bodies: list[dict[str, Any]]) -> tuple[list[tuple[Any, ...]], list[list[int]]]:
    """Per body: (estimate, character offsets, message ends, characters, pieces,
    previous tokens, whether it has an identity); per pair: the samples they share."""
    per_body, keys = [], []
    for body in bodies:
        estimate = estimate_and_sample(body)
        prefix = prompt_prefix(body, prompt_tokens=estimate)
        assert prefix is not None
        samples = sample_prompt(body)
        assert samples is not None
        per_body.append(
            (
                estimate,
                tuple(prefix.tokens_at(i) for i in range(len(prefix.keys))),
                tuple(samples.ends),
                samples.chars,
                samples.pieces,
                prefix.previous_tokens,
                prefix.identity is not None,
                conversation_key(body, prefix) is not None,
            )
        )
        keys.append(list(prefix.keys))
    shared = [[_shared(a, b) for b in keys] for a in keys]
    return per_body, shared


def test_the_walk_estimates_as_the_estimator_does() -> None:
    for body in corpus():
        assert estimate_and_sample(body) == estimate_prompt_tokens(body)


def test_samples_taken_with_the_estimate_are_the_ones_read_alone() -> None:
    bodies = corpus()
    with_estimate = [list(prompt_prefix(b, prompt_tokens=estimate_and_sample(b)).keys) for b in bodies]  # type: ignore[union-attr]
    for body, keys in zip(corpus(), with_estimate, strict=True):  # fresh objects: nothing left from the estimate
        assert list(prompt_prefix(body, prompt_tokens=1000).keys) == keys  # type: ignore[union-attr]


def _with_call(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": "fix module_1.py"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": _SOURCE},
        ],
    }


_PLAIN_CALL = {"id": "call_1", "type": "function", "function": {"name": "tool_1", "arguments": '{"path": "a.py"}'}}
_OTHER_CALLS = [
    {**_PLAIN_CALL, "function": {"name": "tool_1", "arguments": '{"path": "b.py"}'}},
    {**_PLAIN_CALL, "id": "call_2"},
    {**_PLAIN_CALL, "index": 0},  # another shape: hashed as its JSON
    {**_PLAIN_CALL, "function": {"name": "tool_1", "arguments": {"path": "a.py"}}},
    {**_PLAIN_CALL, "function": {"name": "tool_1", "arguments": '{"path": "a.py"}', "extra": 1}},
]


@pytest.mark.parametrize("other", _OTHER_CALLS)
def test_a_tool_call_that_differs_in_any_field_ends_the_shared_prefix(other: dict[str, Any]) -> None:
    plain, changed = _with_call(_PLAIN_CALL), _with_call(other)
    assert estimate_and_sample(changed) == estimate_prompt_tokens(changed)
    keys = [list(prompt_prefix(b, prompt_tokens=estimate_and_sample(b)).keys) for b in (plain, changed)]  # type: ignore[union-attr]
    again = list(prompt_prefix(_with_call(dict(_PLAIN_CALL)), prompt_tokens=1000).keys)  # type: ignore[union-attr]
    assert again == keys[0]
    assert _shared(keys[0], keys[1]) == 4  # the system prompt's 3 samples and the user message's, not the call's


@pytest.mark.parametrize("index", range(len(corpus())))
def test_samples_are_the_pinned_ones(index: int) -> None:
    per_body, _ = facts(corpus())
    assert per_body[index] == PINNED[index]


def test_prompts_share_the_pinned_samples() -> None:
    _, shared = facts(corpus())
    assert shared == PINNED_SHARED


# (estimate, tokens at each sample, message ends, characters, pieces, previous tokens,
#  has an identity, has a conversation key), as the walk before issue 21's work gave them
PINNED: list[tuple[Any, ...]] = [(2508, (379, 1285, 2191, 2502, 2508), (0, 3, 4), 11342, 3, 379, True, True),
 (3389, (401, 1357, 2314, 2643, 2649, 2653, 3383, 3389), (0, 3, 4, 5, 6, 7), 14508, 6, 2653, True, True),
 (4266, (414, 1404, 2393, 2734, 2740, 2744, 3498, 3504, 3505, 4259, 4266), (0, 3, 4, 5, 6, 7, 8, 9, 10),
  17658, 9, 3505, True, True),
 (5147, (424, 1436, 2449, 2797, 2803, 2807, 3579, 3585, 3586, 4358, 4364, 4368, 5140, 5147),
  (0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13), 20824, 12, 4368, True, True),
 (2508, (379, 1285, 2191, 2502, 2508), (0, 3, 4), 11342, 3, 379, True, True),
 (3389, (401, 1357, 2314, 2643, 2649, 2653, 3383, 3389), (0, 3, 4, 5, 6, 7), 14508, 6, 2653, True, True),
 (2100, (851, 1702, 2026, 2092, 2100), (2, 3, 4), 10103, 3, 2026, True, True),
 (4648, (916, 1833, 2181, 2253, 2261, 2289, 3206, 4122, 4640, 4648), (2, 3, 4, 5, 8, 9), 20769, 6, 2289, True,
  True),
 (7196, (937, 1875, 2231, 2304, 2312, 2342, 3279, 4217, 4746, 4754, 4783, 5721, 6658, 7187, 7196),
  (2, 3, 4, 5, 8, 9, 10, 13, 14), 31435, 9, 4783, True, True),
 (9744,
  (947, 1895, 2255, 2330, 2338, 2367, 3315, 4263, 4798, 4806, 4836, 5784, 6732, 7267, 7275, 7305, 8253, 9201,
   9735, 9744),
  (2, 3, 4, 5, 8, 9, 10, 13, 14, 15, 18, 19), 42101, 12, 7305, True, True),
 (2100, (851, 1702, 2026, 2092, 2100), (2, 3, 4), 10103, 3, 2026, True, True),
 (4648, (916, 1833, 2181, 2253, 2261, 2289, 3206, 4122, 4640, 4648), (2, 3, 4, 5, 8, 9), 20769, 6, 2289, True,
  True),
 (2021, (16, 871, 1725, 2019, 2021), (0, 3, 4), 9688, 3, 16, True, True),
 (2886, (18, 940, 1862, 2179, 2181, 2181, 2884, 2886), (0, 3, 4, 5, 6, 7), 12817, 6, 2181, True, True),
 (3750, (18, 982, 1945, 2276, 2278, 2278, 3012, 3014, 3014, 3748, 3750), (0, 3, 4, 5, 6, 7, 8, 9, 10), 15946,
  9, 3014, True, True),
 (4309, (417, 1413, 2409, 2752, 2758, 2762, 2766, 2772, 2773, 3532, 3538, 3543, 4302, 4309),
  (0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13), 17717, 12, 3543, True, True),
 (6732, (1104, 2209, 3313, 4418, 5523, 6627, 6731, 6732), (6, 7), 24962, 2, 0, True, True),
 (840, (840,), (0,), 3120, 1, 0, False, False)]
PINNED_SHARED: list[list[int]] = [[5, 5, 5, 5, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0],
 [5, 8, 8, 8, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0],
 [5, 8, 11, 11, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0],
 [5, 8, 11, 14, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0],
 [4, 4, 4, 4, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0],
 [4, 4, 4, 4, 5, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0],
 [0, 0, 0, 0, 0, 0, 5, 5, 5, 5, 4, 4, 0, 0, 0, 0, 0, 0],
 [0, 0, 0, 0, 0, 0, 5, 10, 10, 10, 4, 4, 0, 0, 0, 0, 0, 0],
 [0, 0, 0, 0, 0, 0, 5, 10, 15, 15, 4, 4, 0, 0, 0, 0, 0, 0],
 [0, 0, 0, 0, 0, 0, 5, 10, 15, 20, 4, 4, 0, 0, 0, 0, 0, 0],
 [0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 5, 5, 0, 0, 0, 0, 0, 0],
 [0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 5, 10, 0, 0, 0, 0, 0, 0],
 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 5, 5, 0, 0, 0],
 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 8, 8, 0, 0, 0],
 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 8, 11, 0, 0, 0],
 [5, 6, 6, 6, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 14, 0, 0],
 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0],
 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]]
