"""Reading every event of an OpenAI chat stream, for the transforms that translate its
chunks to another API (Anthropic Messages, the Responses API). The relay's own tap
(:mod:`latgate.proxy.sse`) stays on its cheaper one-line path; these read each event
whole.

Format: the HTML Living Standard, "Server-sent events" (9.2.6): LF or CRLF lines, one
optional space after ``data:``, several ``data`` lines joined by LF; OpenAI chat
streams end with ``data: [DONE]`` (OpenAI API reference, "Streaming").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson


def data_payloads(events: bytes) -> Iterator[bytes]:
    """The ``data`` of each SSE event in ``events`` (complete events, as
    :meth:`latgate.proxy.sse.StreamTap.feed` forwards them; LF or CRLF lines, one optional space after
    ``data:``, several ``data`` lines joined by LF). For the translating transforms,
    which read every event; the tap itself stays on its cheaper one-line path."""
    for event in events.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if lines:
            yield b"\n".join(lines)


def chat_chunks(events: bytes) -> Iterator[dict[str, Any]]:
    """Each JSON-object chunk of an OpenAI chat stream in ``events`` (complete events,
    as :func:`data_payloads` reads them), skipping ``[DONE]`` and any ``data`` that is
    not a JSON object. For the transforms that translate chat chunks to another API."""
    for data in data_payloads(events):
        if data == b"[DONE]":
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(chunk, dict):
            yield chunk
