"""Reply plans rendered as OpenAI wire bytes: SSE stream steps or one JSON body.

Formats follow the OpenAI API reference ("The chat completion chunk object", "The
completion object") and vLLM's server, as clients parse them: each event is
``data: {json}\\n\\n`` (WHATWG Server-Sent Events); a chat stream starts with a
role-only delta, then one chunk per token, a chunk with ``finish_reason``, a
usage-only chunk (``choices: []``) when ``stream_options.include_usage`` is true, and
``data: [DONE]``. Everything is encoded before the first token is due, so streaming
costs one ``send`` per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from latgate.commands.sim.replies import ChoicePlan

DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Envelope:
    """What every chunk or body of one reply repeats (``cached_tokens``: the prompt
    tokens served from the prefix cache, ``None`` when the engine has no cache)."""

    id: str
    created: int
    model: str
    prompt_tokens: int
    include_usage: bool = False
    cached_tokens: int | None = None


@dataclass(frozen=True)
class StreamPlan:
    """``steps[i]`` is sent when token ``i`` is due; ``tail`` right after the last one."""

    steps: tuple[bytes, ...]
    tail: bytes


def usage(plans: Sequence[ChoicePlan], prompt_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """The ``usage`` object: completion tokens summed over choices; with ``cached_tokens``,
    ``prompt_tokens_details: {"cached_tokens": n}`` as OpenAI sends it and vLLM does with
    ``--enable-prompt-tokens-details``."""
    completion = sum(plan.completion_tokens for plan in plans)
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _stream_chunk(envelope: Envelope, object_type: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed chunk of ``object_type`` (``chat.completion.chunk`` or
    ``text_completion``): the envelope's fields, ``choices``, and ``usage: null`` when
    usage was asked for."""
    chunk: dict[str, Any] = {
        "id": envelope.id,
        "object": object_type,
        "created": envelope.created,
        "model": envelope.model,
        "choices": choices,
    }
    if envelope.include_usage:
        chunk["usage"] = None
    return chunk


def _chat_chunk(envelope: Envelope, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return _stream_chunk(envelope, "chat.completion.chunk", choices)


def _chat_delta(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _chat_pieces(plan: ChoicePlan) -> list[dict[str, Any]]:
    call = plan.tool_call
    if call is None:
        return [{"content": piece} for piece in plan.text_pieces]
    header = {"index": 0, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
    fragments = [{"index": 0, "function": {"arguments": piece}} for piece in call.argument_pieces]
    return [{"tool_calls": [tool_delta]} for tool_delta in [header, *fragments]]


def chat_stream(plans: Sequence[ChoicePlan], envelope: Envelope) -> StreamPlan:
    """The SSE bytes of a streamed chat completion, choices interleaved per token."""
    pieces = [_chat_pieces(plan) for plan in plans]
    role = b"".join(
        _event(_chat_chunk(envelope, [_chat_delta(p.index, {"role": "assistant", "content": ""})]))
        for p in plans
    )
    steps = []
    for step in range(max(len(p) for p in pieces)):
        steps.append(
            b"".join(
                _event(_chat_chunk(envelope, [_chat_delta(plan.index, choice_pieces[step])]))
                for plan, choice_pieces in zip(plans, pieces, strict=True)
                if step < len(choice_pieces)
            )
        )
    steps[0] = role + steps[0]
    tail = [_event(_chat_chunk(envelope, [_chat_delta(p.index, {}, p.finish_reason)])) for p in plans]
    if envelope.include_usage:
        tail.append(_event({**_chat_chunk(envelope, []), "usage": usage(plans, envelope.prompt_tokens, envelope.cached_tokens)}))
    tail.append(DONE_EVENT)
    return StreamPlan(steps=tuple(steps), tail=b"".join(tail))


def chat_body(plans: Sequence[ChoicePlan], envelope: Envelope) -> bytes:
    """The JSON body of a non-streamed chat completion (``object: chat.completion``)."""
    choices = []
    for plan in plans:
        message: dict[str, Any] = {"role": "assistant", "content": plan.text, "refusal": None}
        if plan.tool_call is not None:
            call = plan.tool_call
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ]
        choices.append(
            {"index": plan.index, "message": message, "logprobs": None, "finish_reason": plan.finish_reason}
        )
    return orjson.dumps(
        {
            "id": envelope.id,
            "object": "chat.completion",
            "created": envelope.created,
            "model": envelope.model,
            "choices": choices,
            "usage": usage(plans, envelope.prompt_tokens, envelope.cached_tokens),
        }
    )


def _completion_chunk(envelope: Envelope, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return _stream_chunk(envelope, "text_completion", choices)


def _completion_choice(index: int, text: str, finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


def completion_stream(plans: Sequence[ChoicePlan], envelope: Envelope) -> StreamPlan:
    """The SSE bytes of a streamed legacy completion (``object: text_completion``)."""
    steps = []
    for step in range(max(len(p.text_pieces) for p in plans)):
        steps.append(
            b"".join(
                _event(_completion_chunk(envelope, [_completion_choice(p.index, p.text_pieces[step])]))
                for p in plans
                if step < len(p.text_pieces)
            )
        )
    tail = [
        _event(_completion_chunk(envelope, [_completion_choice(p.index, "", p.finish_reason)])) for p in plans
    ]
    if envelope.include_usage:
        tail.append(
            _event({**_completion_chunk(envelope, []), "usage": usage(plans, envelope.prompt_tokens, envelope.cached_tokens)})
        )
    tail.append(DONE_EVENT)
    return StreamPlan(steps=tuple(steps), tail=b"".join(tail))


def completion_body(plans: Sequence[ChoicePlan], envelope: Envelope) -> bytes:
    """The JSON body of a non-streamed legacy completion."""
    return orjson.dumps(
        {
            "id": envelope.id,
            "object": "text_completion",
            "created": envelope.created,
            "model": envelope.model,
            "choices": [_completion_choice(p.index, p.text, p.finish_reason) for p in plans],
            "usage": usage(plans, envelope.prompt_tokens, envelope.cached_tokens),
        }
    )
