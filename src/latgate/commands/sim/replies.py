"""What the simulated model says: reproducible text, or a call to one of the request's tools.

A reply is planned in full before any time passes: one :class:`ChoicePlan` per choice
(``n``), each a list of pieces, one per generated token. Text pieces are words from a
small vocabulary drawn by a RNG seeded with the simulator seed and the request's
content, so the same request always gets the same reply and different requests differ.

Tool calls follow the OpenAI chat completions reference ("Function calling"): when the
request has ``tools``, ``tool_choice`` is not ``"none"`` and the last message is the
user's, each choice calls one tool (the one ``tool_choice`` names, else the first of the
simulator's ``preferred_tools`` the request offers, else the first) with
arguments built from the tool's JSON Schema ``required`` fields; the arguments are
split into several pieces, as engines stream them. After a ``tool`` message the reply
is text, so an agent's loop ends.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from latgate.foundation.errors import InvalidRequest

VOCABULARY = (
    "the", "a", "request", "token", "latency", "stream", "gateway", "engine", "batch",
    "prefill", "decode", "cache", "prompt", "route", "fast", "pool", "model", "reply",
    "simulated", "provider", "queue", "budget", "first", "next", "time", "is", "of",
    "to", "and", "in", "for", "with", "each", "this", "that", "we", "it", "runs",
    "serves", "measures", "sends", "waits", "returns", "quickly", "steadily", "here",
    "now", "then", "again", "every", "output", "input", "chunk", "event", "server",
    "client", "path", "rule", "policy", "window", "context", "long", "short", "ok",
)  # fmt: skip

MAX_CHOICES = 16
ARGUMENT_PIECE_CHARS = 8


@dataclass(frozen=True)
class ToolCall:
    """One tool call: ``arguments`` is the JSON text, streamed as ``argument_pieces``."""

    id: str
    name: str
    arguments: str
    argument_pieces: tuple[str, ...]


@dataclass(frozen=True)
class ChoicePlan:
    """One choice: its text pieces or its tool call, and why it ended.

    ``completion_tokens`` counts one token per streamed piece (for a tool call: the
    header fragment plus each arguments fragment).
    """

    index: int
    text_pieces: tuple[str, ...] = ()
    tool_call: ToolCall | None = None
    finish_reason: str = "stop"

    @property
    def completion_tokens(self) -> int:
        if self.tool_call is not None:
            return 1 + len(self.tool_call.argument_pieces)
        return len(self.text_pieces)

    @property
    def text(self) -> str:
        return "".join(self.text_pieces)


def requested_max_tokens(body: Mapping[str, Any]) -> int | None:
    """``max_completion_tokens`` or ``max_tokens`` from the body (``None`` if unset).

    Raises:
        InvalidRequest: not a positive integer.
    """
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidRequest(f"{field} must be a positive integer", param=field)
        return value
    return None


def choice_count(body: Mapping[str, Any]) -> int:
    """``n`` from the body (default 1). Raises :class:`InvalidRequest` outside 1..16."""
    n = body.get("n", 1)
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
        raise InvalidRequest(f"n must be an integer between 1 and {MAX_CHOICES}", param="n")
    return n


def plan_text(
    *, rng_seed: bytes, n: int, max_tokens: int | None, default_max_tokens: int, max_output_tokens: int
) -> list[ChoicePlan]:
    """Text choices: ``max_tokens`` tokens (finish ``length``) or the default (``stop``), capped."""
    if max_tokens is not None and max_tokens <= max_output_tokens:
        count, finish = max_tokens, "length"
    else:
        count, finish = min(max_tokens or default_max_tokens, max_output_tokens), "stop"
    plans = []
    for index in range(n):
        rng = random.Random(rng_seed + index.to_bytes(2, "big"))
        words = rng.choices(VOCABULARY, k=count)
        words[0] = words[0].capitalize()
        pieces = [words[0]] + [" " + word for word in words[1:]]
        if finish == "stop":
            pieces[-1] += "."
        plans.append(ChoicePlan(index=index, text_pieces=tuple(pieces), finish_reason=finish))
    return plans


def plan_chat(
    body: Mapping[str, Any],
    *,
    rng_seed: bytes,
    default_max_tokens: int,
    max_output_tokens: int,
    preferred_tools: Sequence[str] = (),
) -> list[ChoicePlan]:
    """The choices of a chat completion (``body`` already has a non-empty ``messages`` list).

    Raises:
        InvalidRequest: bad ``n``, ``max_tokens``, ``tools`` or ``tool_choice``.
    """
    n = choice_count(body)
    max_tokens = requested_max_tokens(body)
    tool = _tool_to_call(body, preferred_tools)
    if tool is None:
        return plan_text(
            rng_seed=rng_seed,
            n=n,
            max_tokens=max_tokens,
            default_max_tokens=default_max_tokens,
            max_output_tokens=max_output_tokens,
        )
    function = tool.get("function") or {}
    name = str(function.get("name"))
    arguments = orjson.dumps(arguments_for(function.get("parameters") or {})).decode()
    plans = []
    for index in range(n):
        rng = random.Random(rng_seed + index.to_bytes(2, "big"))
        call = ToolCall(
            id=f"call_{rng.getrandbits(96):024x}",
            name=name,
            arguments=arguments,
            argument_pieces=split_pieces(arguments),
        )
        plans.append(ChoicePlan(index=index, tool_call=call, finish_reason="tool_calls"))
    return plans


def split_pieces(text: str, *, piece_chars: int = ARGUMENT_PIECE_CHARS) -> tuple[str, ...]:
    """``text`` cut into pieces of ``piece_chars`` characters, at least two when it has two."""
    size = max(1, min(piece_chars, len(text) // 2))
    return tuple(text[i : i + size] for i in range(0, len(text), size)) or ("",)


def _tool_to_call(body: Mapping[str, Any], preferred_tools: Sequence[str]) -> Mapping[str, Any] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, Mapping) and isinstance(t.get("function"), Mapping) and t["function"].get("name")
        for t in tools
    ):
        raise InvalidRequest("tools must be a list of {type: function, function: {name, ...}}", param="tools")
    choice = body.get("tool_choice", "auto")
    messages: Sequence[Any] = body["messages"]
    last = messages[-1] if messages else {}
    if not tools or choice == "none" or not isinstance(last, Mapping) or last.get("role") != "user":
        return None
    if isinstance(choice, Mapping):
        wanted = (choice.get("function") or {}).get("name")
        for tool in tools:
            if tool["function"]["name"] == wanted:
                return tool
        raise InvalidRequest(f"tool_choice names a function not in tools: {wanted!r}", param="tool_choice")
    if choice not in ("auto", "required"):
        raise InvalidRequest(
            "tool_choice must be 'none', 'auto', 'required' or a function", param="tool_choice"
        )
    offered = {tool["function"]["name"]: tool for tool in tools}
    for name in preferred_tools:
        if name in offered:
            return offered[name]
    return tools[0]


def arguments_for(schema: Mapping[str, Any]) -> dict[str, Any]:
    """An arguments object satisfying ``schema``'s ``required`` properties (recursively).

    Strings are the property's name, numbers 1 (or the ``minimum``), booleans true,
    arrays hold ``minItems`` (at least one) items, enums give their first value, and a
    ``default`` or ``const`` wins over all of these.
    """
    value = value_for(schema, name="value")
    return value if isinstance(value, dict) else {}


def value_for(schema: object, *, name: str) -> Any:
    """A JSON value valid for the (simple) JSON Schema ``schema``; ``name`` seeds strings."""
    if not isinstance(schema, Mapping):
        return name
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            usable = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")]
            return value_for((usable or options)[0], name=name)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and isinstance(schema.get("properties"), Mapping):
        kind = "object"
    if kind == "object":
        properties = given if isinstance(given := schema.get("properties"), Mapping) else {}
        required = listed if isinstance(listed := schema.get("required"), list) else []
        return {str(key): value_for(properties.get(key, {}), name=str(key)) for key in required}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1) or 1))
        return [value_for(schema.get("items", {}), name=name) for _ in range(count)]
    if kind in ("integer", "number"):
        minimum = schema.get("minimum", schema.get("exclusiveMinimum"))
        value = 1 if not isinstance(minimum, (int, float)) else max(1, int(minimum) + 1)
        maximum = schema.get("maximum")
        return min(value, int(maximum)) if isinstance(maximum, (int, float)) else value
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = name
    min_length = schema.get("minLength")
    if isinstance(min_length, int) and len(text) < min_length:
        text = text + "x" * (min_length - len(text))
    return text
