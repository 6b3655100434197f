"""The bytes TileRT's prefill/decode router answers with, for the simulator's ``tilert``
profile.

Shapes as ``tilert/pd_vllm/pd_router.py`` (tile-ai/TileRT v0.1.5) builds them:

- A stream (chat only) starts with a role-only chunk (``delta: {"role": "assistant"}``),
  then one chunk per decoded piece (``content``, or ``tool_calls`` once its parser has
  the whole call), then a finish chunk (``delta: {}``, ``finish_reason``) that always
  carries ``usage`` with ``prompt_tokens`` and ``completion_tokens`` and no
  ``total_tokens``, whatever ``stream_options`` asked, then ``data: [DONE]``. Chunks
  have no ``logprobs`` field and are encoded with Python's default JSON separators
  (``", "`` and ``": "``), non-ASCII unescaped.
- A decode failure mid-stream is a content delta ``"\\n[decode error: MESSAGE]"``
  followed by a normal finish chunk (``finish_reason: "stop"``) and ``[DONE]``.
- A non-streamed answer has the usual ``choices`` and ``usage`` (no ``total_tokens``)
  plus ``pd_timing_ms`` (``prefill``, then the decode node's timings, in ms); a legacy
  completion's choice also carries ``token_ids``. Non-streamed bodies and errors are
  compact JSON (Starlette's ``JSONResponse``); errors are ``{"error": "MESSAGE"}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from latgate.commands.sim.replies import ChoicePlan

DONE_EVENT = b"data: [DONE]\n\n"
BUSY_MESSAGE = "all decode nodes busy"
STREAMED_COMPLETIONS_MESSAGE = "streaming is supported on /v1/chat/completions"


def error_body(message: str) -> bytes:
    """TileRT's error body: ``{"error": "MESSAGE"}`` (a string, not an OpenAI error object)."""
    return compact({"error": message})


def compact(payload: dict[str, Any]) -> bytes:
    """JSON as Starlette's ``JSONResponse`` renders it."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


@dataclass(frozen=True)
class Chunks:
    """The chunk envelope of one streamed answer (TileRT reuses the prefill's id and model)."""

    id: str
    created: int
    model: str
    prompt_tokens: int

    def chunk(self, delta: dict[str, Any], *, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
        payload: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if usage is not None:
            payload["usage"] = usage
        return _event(payload)

    def role(self) -> bytes:
        """The first event, sent once prefill is done."""
        return self.chunk({"role": "assistant"})

    def steps(self, plan: ChoicePlan) -> tuple[bytes, ...]:
        """One entry per decoded token: its content chunk, or ``b""`` for the tokens of a
        tool call until the last, which carries the whole call."""
        call = plan.tool_call
        if call is None:
            return tuple(self.chunk({"content": piece}) for piece in plan.text_pieces)
        delta = {
            "tool_calls": [
                {"index": 0, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ]
        }
        return (b"",) * (plan.completion_tokens - 1) + (self.chunk(delta),)

    def decode_error(self, message: str) -> bytes:
        """A decode failure, written into the answer's text."""
        return self.chunk({"content": f"\n[decode error: {message}]"})

    def finish(self, *, finish_reason: str, completion_tokens: int) -> bytes:
        """The finish chunk (always with usage) and ``[DONE]``."""
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens}
        return self.chunk({}, finish=finish_reason, usage=usage) + DONE_EVENT


def answer_body(
    plan: ChoicePlan, chunks: Chunks, *, chat: bool, prefill_ms: float, decode_ms: float
) -> bytes:
    """A non-streamed answer (chat or legacy completion) with ``pd_timing_ms``."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": plan.finish_reason}
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": plan.text}
        if plan.tool_call is not None:
            call = plan.tool_call
            message["content"] = ""
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ]
            choice["finish_reason"] = "tool_calls"
        choice["message"] = message
    else:
        choice["text"] = plan.text
        choice["token_ids"] = list(range(100, 100 + plan.completion_tokens))
    return compact(
        {
            "id": chunks.id,
            "object": "chat.completion" if chat else "text_completion",
            "created": chunks.created,
            "model": chunks.model,
            "choices": [choice],
            "usage": {"prompt_tokens": chunks.prompt_tokens, "completion_tokens": plan.completion_tokens},
            "pd_timing_ms": {
                "prefill": round(prefill_ms, 1),
                "wire_wait": 0.4,
                "convert": 0.2,
                "inject": 0.3,
                "decode": round(decode_ms, 1),
            },
        }
    )
