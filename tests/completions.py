"""Canned chat traffic for upstream tests: the request a client sends, the non-streamed
answer an upstream gives (OpenAI API reference, "The chat completion object"), the
streamed one as SSE events of chunks ("The chat completion chunk object"), and how many
requests an upstream got that the gateway proxied.

The SSE builders are the one place tests write an upstream's stream::

    ROLE + content("Hel") + content("lo") + event(chat_chunk({}, finish_reason="stop")) + DONE
"""

from __future__ import annotations

import json

from replay import ReplayServer

CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat_completion(*, prompt_tokens: int = 3, completion_tokens: int = 1) -> dict:
    """A ``chat.completion`` for model ``m`` answering "ok", with this usage (tokens)."""
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def proxied_posts(server: ReplayServer) -> int:
    """Requests ``server`` got that were proxied (active health probes are GETs)."""
    return sum(1 for r in server.requests if r.method == "POST")


DONE = b"data: [DONE]\n\n"
"""The event that ends an OpenAI stream."""


def event(payload: object) -> bytes:
    """One SSE event, ``data: JSON\\n\\n`` (``json.dumps`` spacing, as a Python upstream writes it)."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chat_chunk(
    delta: dict | None = None,
    *,
    finish_reason: str | None = None,
    usage: dict | None = None,
    model: str = "m",
    **choice: object,
) -> dict:
    """A ``chat.completion.chunk`` of ``model``: one choice carrying ``delta`` and
    ``finish_reason`` (and any other ``choice`` fields, e.g. ``index=1``,
    ``stop_reason="</s>"``), or no choice when ``delta`` is None (a usage-only chunk);
    ``usage`` when given (:func:`usage`)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason, **choice}]
    chunk: dict = {"id": "c", "object": "chat.completion.chunk", "model": model, "choices": choices}
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def content(text: str) -> bytes:
    """The SSE event of a chunk carrying the content ``text``."""
    return event(chat_chunk({"content": text}))


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """A ``usage`` object (tokens; the total is their sum)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


ROLE = event(chat_chunk({"role": "assistant", "content": ""}))
"""The first event of a stream: the assistant role, no content yet."""


def stream_with_usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    """A chat stream answering "ok", then a usage chunk of these counts, then ``[DONE]``."""
    stop = event(chat_chunk({}, finish_reason="stop"))
    return ROLE + content("ok") + stop + event(chat_chunk(usage=usage(prompt_tokens, completion_tokens))) + DONE


def decoded_answer(text: str) -> str:
    """An answer as a client reads it: ``text``, then every JSON document in it (SSE
    ``data:`` lines too) decoded and written again without escapes, one a line."""
    parts = [text]
    for line in text.replace("\r", "").split("\n"):
        line = line.removeprefix("data:").strip()
        if line.startswith("{"):
            parts.append(json.dumps(json.loads(line), ensure_ascii=False))
    return "\n".join(parts)
