"""What an SSE stream's chunks say, read one event's data at a time: generated-content
units, usage, finish reasons, ``[DONE]``, in-band errors, and the facts the edits need
(a usage-only chunk to drop, usage to strip from a chunk, a terminal chunk missing its
``system_fingerprint``).

:class:`ChunkFacts` is the bottom of :class:`~latgate.forwarding.sse.StreamTap`: framing
(:mod:`latgate.forwarding.sse`) finds events, this reads their data, the edits
(:mod:`latgate.forwarding.sse_edits`) change what is forwarded. The three are one object's
methods over one set of slots (a class each, stacked), so that the per-chunk path pays
no extra attribute hop between them.

Chunk schema: OpenAI's ``CreateChatCompletionStreamResponse`` (chat), the completions
stream's ``choices[].text``, and the Responses API's ``ResponseStreamEvent``. A chat
chunk that differs from the stream's last parsed content chunk only in the text of its
one content string is counted from the bytes, without a JSON parse
(:class:`~latgate.forwarding.chunk_template.ChunkTemplate`); anything else is parsed with
orjson.
"""

from __future__ import annotations

from typing import Any

import orjson

from latgate.forwarding.chunk_template import ChunkTemplate

#: how many times one stream may (re)learn its chunk template: an upstream whose chunks
#: vary outside the text (e.g. a random padding field) stops paying for the attempts
_TEMPLATE_BUDGET = 4
#: what :meth:`ChunkFacts._chunk` returns for data that is not a chunk (forwarded redacted)
_FOREIGN = -2
#: the error kind of a stream ended by an event whose data is not JSON
BAD_EVENT = "stream_bad_event"
#: that error's message (the event's own text, which may echo a key, is not shown)
UNREADABLE_EVENT = "the upstream sent an event latgate cannot read (not JSON)"


class ChunkFacts:
    """The facts of one stream's chunks (see :class:`~latgate.forwarding.sse.StreamTap` for
    the arguments and the public attributes)."""

    __slots__ = (
        "_drop_usage",
        "_fingerprint",
        "_kind",
        "_learn",
        "_open",
        "_strip",
        "_template",
        "_text_error",
        "_unstamped",
        "aborted",
        "content_chunks",
        "done",
        "error",
        "error_kind",
        "events",
        "finish_reason",
        "responses",
        "usage",
    )

    def __init__(self, *, drop_usage_chunk: bool, text_error: bytes | None) -> None:
        self._kind: str | None = None  # the type of the Responses event just parsed
        self._text_error = text_error
        self._strip: dict[str, Any] | None = None  # the chunk just parsed, to forward without its usage
        self._drop_usage = drop_usage_chunk
        self._template: ChunkTemplate | None = None
        self._learn = _TEMPLATE_BUDGET
        self._unstamped = False  # the event just parsed is a terminal chunk without system_fingerprint
        self._fingerprint: bytes | None = None  # the dropped usage chunk's system_fingerprint, JSON-encoded
        self._open: set[int] = set()  # choice indexes seen without their finish_reason yet
        self.content_chunks = 0
        self.aborted = False
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.error_kind = "error_event"
        self.events = 0
        self.finish_reason: str | None = None
        self.responses = False

    def _in_text_error(self, content: object) -> bool:
        """A content delta reporting a failure in the text (``\\n[decode error: MESSAGE]``)."""
        marker = (self._text_error or b"").decode()
        if not isinstance(content, str) or marker not in content:
            return False
        if self.error is None:
            message = content.strip().removeprefix("[").removesuffix("]")
            self.error = {"message": message, "type": "api_error", "code": "decode_error"}
            self.error_kind = "decode_error"
        return True

    def _chunk(self, payload: bytes) -> int:
        """Content units in one event's data; -1 when the event is to be dropped."""
        template = self._template
        if self._text_error is not None and self._text_error in payload:
            template = None  # looked at: its text may be an error
        if template is not None and payload.startswith(template.head) and payload.endswith(template.tail):
            # ChunkTemplate's body test: non-empty, no quote, no CR, no trailing backslash
            text = payload[template.head_len : len(payload) - template.tail_len]
            if text and 34 not in text and 13 not in text and text[-1] != 92:
                self.content_chunks += 1
                return 1
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            try:  # bytes that are not UTF-8 (U+FFFD): an error event so written is still one
                chunk = orjson.loads(payload.decode("utf-8", "replace"))
            except orjson.JSONDecodeError:
                return self._unreadable(payload)
        if not isinstance(chunk, dict) or 13 in payload:  # 13: a CR, which a client reads as a line end
            return _FOREIGN
        error = chunk.get("error")
        if error is not None:
            # Never forwarded as is (its text may name internal hosts or echo a key):
            # the relay reports it with its own, redacted, error event.
            if self.error is None:
                self.error = error if isinstance(error, dict) else {"message": str(error)}
            return -1
        usage = chunk.get("usage")
        if usage and isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices")
        if not choices:
            if choices is None and "type" in chunk:
                return self._responses_event(chunk)
            if usage and self._drop_usage and choices is not None:
                fingerprint = chunk.get("system_fingerprint")
                if isinstance(fingerprint, str):
                    self._fingerprint = orjson.dumps(fingerprint)
                return -1
            return 0 if choices is not None or usage else _FOREIGN
        units = self._choice_units(chunk, choices)
        if units < 0:
            return -1
        self.content_chunks += units
        if usage and self._drop_usage:
            self._strip = chunk
        if units == 1 and self._learn and not usage and len(choices) == 1:
            delta = choices[0].get("delta")
            if isinstance(delta, dict):
                self._learn -= 1
                self._template = ChunkTemplate.of(payload, delta) or self._template
        return units

    def _unreadable(self, payload: bytes) -> int:
        """Data that is not JSON: the stream's end, as an in-band error
        (:data:`BAD_EVENT`: a client could not read the event, a translation could not
        either); empty data is no event's content (forwarded redacted)."""
        if not payload.strip():
            return _FOREIGN
        if self.error is None:
            self.error = {"message": UNREADABLE_EVENT, "type": "api_error"}
            self.error_kind = BAD_EVENT
        return -1

    def _choice_units(self, chunk: dict[str, Any], choices: Any) -> int:
        """Content units in a parsed chunk's ``choices`` (a non-empty value), each
        choice's ``finish_reason`` recorded; -1 when a delta reports an error in its
        text (the event is then dropped)."""
        units = 0
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            finish = choice.get("finish_reason")
            if finish:
                self.finish_reason = str(finish)
                self._open.discard(choice.get("index", 0))
                if finish == "abort":
                    self.aborted = True
                if self._drop_usage and "system_fingerprint" not in chunk:
                    self._unstamped = True
            else:
                self._open.add(choice.get("index", 0))
            delta = choice.get("delta")
            if isinstance(delta, dict):
                if self._text_error is not None and self._in_text_error(delta.get("content")):
                    return -1
                if (
                    delta.get("content")
                    or delta.get("reasoning_content")
                    or delta.get("tool_calls")
                    or delta.get("reasoning")
                ):
                    units += 1
            elif choice.get("text"):
                units += 1
        return units

    def _responses_event(self, chunk: dict[str, Any]) -> int:
        """One OpenAI Responses API stream event (``ResponseStreamEvent``, passed through
        to providers that serve ``/responses``): a ``*.delta`` event with a non-empty
        ``delta`` is one content unit, ``response.completed`` (or ``.incomplete``)
        carries ``response.usage``, an ``error`` event is an in-band error."""
        kind = chunk["type"]
        if not isinstance(kind, str):
            return _FOREIGN
        self._kind = kind
        if kind.endswith(".delta"):
            self.responses = True
            if chunk.get("delta"):
                self.content_chunks += 1
                return 1
            return 0
        if kind == "error":
            if self.error is None:
                self.error = {"message": chunk.get("message"), "code": chunk.get("code"), "type": "api_error"}
            return -1
        self.responses = True
        if kind in ("response.completed", "response.incomplete"):
            self.finish_reason = kind
        response = chunk.get("response")
        if isinstance(response, dict) and isinstance(response.get("usage"), dict):
            self.usage = response["usage"]
        return 0

    @property
    def finished(self) -> bool:
        """Every choice seen has its ``finish_reason`` (a Responses stream: its terminal
        event came): the upstream said the answer is whole, ``[DONE]`` or not."""
        return self.finish_reason is not None and not self._open
