"""Reading every event of an OpenAI chat stream, for the transforms that translate its
chunks to another API (Anthropic Messages, the Responses API). The relay's own tap
(:mod:`latgate.forwarding.sse`) stays on its cheaper one-line path; these read each event
whole.

Format: the HTML Living Standard, "Server-sent events" (9.2.6): LF or CRLF lines, one
optional space after ``data:``, several ``data`` lines joined by LF; OpenAI chat
streams end with ``data: [DONE]`` (OpenAI API reference, "Streaming").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from latgate.forwarding.transform import UntranslatableAnswer

#: a UTF-8 byte order mark, which the SSE spec strips from the start of a stream
BOM = b"\xef\xbb\xbf"
#: the error of an event whose data is not JSON even decoded with replacement
UNDECODABLE_EVENT = "the upstream sent an event latgate cannot read (not JSON); the response is incomplete"
#: the error of an upstream error event, whose own text (it may echo a key) is not shown
UPSTREAM_ERROR_EVENT = "the upstream reported an error mid-stream; the response is incomplete"


def data_payloads(events: bytes) -> Iterator[bytes]:
    """The ``data`` of each SSE event in ``events`` (complete events, as
    :meth:`latgate.forwarding.sse.StreamTap.feed` forwards them; LF or CRLF lines, one optional space after
    ``data:``, several ``data`` lines joined by LF; a leading byte order mark stripped,
    as the SSE spec does at the start of a stream). For the translating transforms,
    which read every event; the tap itself stays on its cheaper one-line path."""
    for event in events.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = [line[5:].removeprefix(b" ") for line in event.removeprefix(BOM).split(b"\n") if line.startswith(b"data:")]
        if lines:
            yield b"\n".join(lines)


def chat_chunks(events: bytes) -> Iterator[dict[str, Any]]:
    """Each JSON-object chunk of an OpenAI chat stream in ``events`` (complete events,
    as :func:`data_payloads` reads them), skipping ``[DONE]``, empty ``data`` and JSON
    that is not an object. Bytes that are not UTF-8 are read as U+FFFD (the text
    around them kept); ``data`` that is not JSON even so becomes an error chunk
    (``{"error": {"message": UNDECODABLE_EVENT}}``), so the translated stream ends
    with an error rather than as a success without that content. An upstream error
    chunk is yielded with latgate's own message (:data:`UPSTREAM_ERROR_EVENT`), never
    its text."""
    for data in data_payloads(events):
        if data == b"[DONE]" or not data.strip():
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            try:
                chunk = orjson.loads(data.decode("utf-8", "replace"))
            except orjson.JSONDecodeError:
                chunk = {"error": {"message": UNDECODABLE_EVENT, "type": "api_error"}}
        if isinstance(chunk, dict):
            if chunk.get("error") is not None and chunk["error"] != {"message": UNDECODABLE_EVENT, "type": "api_error"}:
                # the relay's tap reports an upstream error event itself, redacted; its text is never shown from here
                chunk = {"error": {"message": UPSTREAM_ERROR_EVENT, "type": "api_error"}}
            yield chunk


def read_chat_completion(body: bytes) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(answer, first choice, its message)`` of a whole chat completion body, for the
    transforms that translate it (only the first choice: neither other API has ``n``).

    Raises:
        UntranslatableAnswer: not a JSON object, ``choices`` not a non-empty list of
            objects, or the first choice without a ``message`` object (``null``): the
            provider's failure (502), never an empty success.
    """
    try:
        chat = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise UntranslatableAnswer("a body that is not JSON") from None
    if not isinstance(chat, dict):
        raise UntranslatableAnswer("a body that is not a JSON object")
    choices = chat.get("choices")
    if not isinstance(choices, list):
        raise UntranslatableAnswer("a chat completion whose 'choices' is not a list")
    if not choices or not isinstance(choices[0], dict):
        raise UntranslatableAnswer("a chat completion without a choice")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise UntranslatableAnswer("a chat completion whose choice has no message")
    return chat, choices[0], message


def content_text(content: object) -> str:
    """The text of a chat message's ``content``: the string, or for a list of parts
    (Mistral-style ``[{"type": "text", "text": ...}]``) the texts of its text parts
    joined; anything else is no text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type", "text") in ("text", "output_text") and isinstance(part.get("text"), str)
        )
    return ""


def tool_calls(message: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``(call, its function)`` for each entry of a chat message's ``tool_calls`` (a list
    of ``{"id", "type": "function", "function": {"name", "arguments"}}``, OpenAI's
    ``ChatCompletionMessageToolCall``) that has a ``function`` object; other entries,
    and a ``tool_calls`` that is not a list, give nothing."""
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            yield call, function
