"""The SSE tap: finds event boundaries in upstream bytes, reads events only to time and
count them, and hands back the bytes to forward.

Format: the HTML Living Standard, "Server-sent events" (9.2.6, interpreting an event
stream): lines end in CRLF, LF or CR; a blank line dispatches the event; lines starting
with ``:`` are comments; ``data:`` may or may not be followed by one space; several
``data`` lines join with LF. OpenAI-style streams carry one JSON chunk per event and
end with ``data: [DONE]`` (OpenAI API reference, "Streaming"; chunk schema
``CreateChatCompletionStreamResponse``).

Forwarding is event-aligned: each :meth:`StreamTap.feed` returns the complete events
received so far and keeps a partial trailing event until its end arrives. So any split
of a stream into reads (an event across reads, a multi-byte UTF-8 character across
reads, CRLF across reads) forwards the same bytes, in order, unchanged, except for two
opt-in edits: dropping the usage-only chunk latgate asked for on the client's behalf,
and rewriting the upstream model name back to the alias the client asked for.

Dropping the usage chunk is invisible to the client: an engine that moves fields to
that chunk when usage is asked for (vLLM puts ``system_fingerprint`` on each terminal
chunk, the one with a ``finish_reason``, without usage, and only on the usage chunk
with it: ``vllm/entrypoints/openai/chat_completion/serving.py``, and ``completion/``
alike) has them put back: from the first terminal chunk without a
``system_fingerprint`` on, events are held until the usage chunk (or ``[DONE]``, or the
end), and the usage chunk's ``system_fingerprint`` is appended to each such terminal
chunk, where the engine would have written it.
Lone-CR line endings are forwarded untouched but not parsed (no known engine sends
them).

Nothing the tap did not read as a chunk reaches the client as the upstream wrote it:
an upstream's text there may echo its key (``: debug auth=Bearer sk-...``). A comment
is replaced by a bare ``:`` (it keeps an idle connection alive, its text means nothing
to a client); any other bytes of an event that are not chunk data (``event:``/``id:``
fields, ``data`` that is not JSON, a JSON value that is no chunk, a CR that a client
would read as a line end) are forwarded redacted (:func:`~latgate.proxy.redact.redact_text`),
their line endings normalised to the stream's own. An ``event: error`` block is an
in-band error whatever its data (plain text too). The one field kept as written is a
Responses stream's ``event:`` line naming its data's ``type``.

Cost: reading events is the relay's per-token work, so the common case is kept to a
few byte comparisons. A read holding exactly one one-line event skips the boundary
search and split; and a chat chunk that differs from the stream's last parsed content
chunk only in the text of its one content string (engines repeat id, model and
framing on every token) is counted from the bytes, without a JSON parse (see
:class:`~latgate.proxy.chunk_template.ChunkTemplate`). Anything else is parsed with orjson.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from latgate.proxy.chunk_template import ChunkTemplate
from latgate.proxy.errors import UpstreamFailure
from latgate.proxy.redact import redact_text

_LF_SEP = b"\n\n"
_CRLF_SEP = b"\r\n\r\n"
_DATA = b"data: "
#: how many times one stream may (re)learn its chunk template: an upstream whose chunks
#: vary outside the text (e.g. a random padding field) stops paying for the attempts
_TEMPLATE_BUDGET = 4
#: what :meth:`StreamTap._chunk` returns for data that is not a chunk (forwarded redacted)
_FOREIGN = -2
#: every line ending a client's SSE parser knows (HTML Living Standard 9.2.6)
_LINE_END = re.compile(rb"\r\n|\r|\n")


class StreamTap:
    """Per-stream parser state.

    Args:
        drop_usage_chunk: the client did not ask for usage: drop events whose
            ``choices`` is empty and that carry ``usage`` (latgate added
            ``stream_options.include_usage`` itself), and take ``usage`` out of a chunk
            with choices that carries it anyway (TileRT's finish chunk always does).
        model_rewrite: ``(served, public)`` model names: ``"model":"served"`` becomes
            ``"model":"public"`` in forwarded bytes.
        max_event_bytes: the largest partial event kept while waiting for its end
            (``[defaults] max_event_bytes``); beyond it :meth:`feed` drops it and raises
            ``UpstreamFailure("too_large")``. ``None``: unbounded.
        text_error: a marker an engine writes into a content delta to report a failure
            in the text (TileRT: ``[decode error: ``); such a chunk is an in-band error
            (``error``), never forwarded.
        secrets: the provider's key, redacted from forwarded bytes that are not chunks.

    Attributes (read after feeding):
        content_chunks: generated-content units seen (a choice whose delta carries
            non-empty ``content``, ``reasoning_content``/``reasoning`` or
            ``tool_calls``, or a completions ``text``), summed over choices; in a
            Responses API stream, each ``*.delta`` event.
        usage: the last ``usage`` object seen (a Responses stream's
            ``response.usage``), or ``None``.
        done: ``data: [DONE]`` was seen.
        finish_reason: the last non-null ``finish_reason`` of a choice (a Responses
            stream's terminal event type, ``response.completed`` or
            ``response.incomplete``), or ``None``.
        responses: the stream is a Responses API event stream (no ``[DONE]`` there).
        aborted: a choice ended with ``finish_reason: "abort"`` (vLLM's, when the
            engine gave up on the request, e.g. on shutdown): the answer is incomplete.
        error: the first ``error`` object an event carried (or the error a content
            delta wrote into the text); such events, and any after them, are not
            forwarded (the relay sends its own redacted error event instead).
        error_kind: ``decode_error`` for an error written into the text, else
            ``error_event``.
        events: complete events seen.
    """

    __slots__ = (
        "_drop_usage",
        "_fingerprint",
        "_held",
        "_kind",
        "_learn",
        "_max_event",
        "_open",
        "_pending",
        "_rewrite",
        "_secrets",
        "_sep",
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

    def __init__(
        self,
        *,
        drop_usage_chunk: bool = False,
        model_rewrite: tuple[str, str] | None = None,
        max_event_bytes: int | None = None,
        text_error: bytes | None = None,
        secrets: tuple[bytes, ...] = (),
    ) -> None:
        self._pending = b""
        self._secrets = secrets
        self._kind: str | None = None  # the type of the Responses event just parsed
        self._max_event = max_event_bytes
        self._text_error = text_error
        self._strip: dict[str, Any] | None = None  # the chunk just parsed, to forward without its usage
        self._sep: bytes | None = None
        self._drop_usage = drop_usage_chunk
        self._rewrite: tuple[tuple[bytes, bytes], ...] | None = None
        if model_rewrite is not None:
            served, public = (orjson.dumps(name) for name in model_rewrite)
            self._rewrite = ((b'"model":' + served, b'"model":' + public), (b'"model": ' + served, b'"model": ' + public))
        self._template: ChunkTemplate | None = None
        self._learn = _TEMPLATE_BUDGET
        # Held events (event bytes, needs the fingerprint) while waiting for a dropped
        # usage chunk; None when not holding.
        self._held: list[tuple[bytes, bool]] | None = None
        self._unstamped = False  # the event just parsed is a terminal chunk without system_fingerprint
        self._fingerprint: bytes | None = None
        self.content_chunks = 0
        self.aborted = False
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.error_kind = "error_event"
        self.events = 0
        self.finish_reason: str | None = None
        self.responses = False
        self._open: set[int] = set()  # choice indexes seen without their finish_reason yet

    def feed(self, data: bytes) -> tuple[bytes, int]:
        """Take one read of upstream bytes.

        Returns:
            ``(to_forward, content_units)``: the bytes of the events completed by this
            read (possibly ``b""``) and how many generated-content units they carry.

        Linear in the bytes fed: a partial event is kept in a ``bytearray`` and only the
        new bytes (plus the separator's length) are searched for a boundary, so one huge
        event arriving in many reads costs no more than its size. After an error nothing
        more is forwarded.
        """
        if self.error is not None:  # only looked at for [DONE] (it may span reads)
            seen = bytes(self._pending[-16:]) + data
            self.done = self.done or b"[DONE]" in seen
            self._pending = bytearray(seen[-16:])
            return b"", 0
        if (
            self._sep is _LF_SEP
            and not self._pending
            and data.startswith(_DATA)
            and data.find(10) == len(data) - 2  # 10: LF (an int is searched with memchr)
            and data[-1] == 10
        ):  # the common read: one one-line event, as an engine flushing per token writes it
            self.events += 1
            payload = data[6:-2]
            if payload == b"[DONE]":
                self.done = True
                if self._held is not None:
                    return self._rewritten(self._release(_LF_SEP) + data), 0
                return data, 0
            units = self._chunk(payload)
            if units < 0:
                if units == _FOREIGN:  # not a chunk: forwarded redacted
                    data, units = self._foreign(data[:-2], _LF_SEP) + _LF_SEP, 0
                elif self._held is not None:
                    return self._rewritten(self._release(_LF_SEP)), 0
                else:
                    return b"", 0
            if self._strip is not None:
                data = self._stripped() + b"\n\n"
            if self._held is not None or self._unstamped:
                self._hold(data[:-2])
                return b"", units
            if self._rewrite is not None:
                for old, new in self._rewrite:
                    data = data.replace(old, new)
            return data, units
        pending = self._pending
        if pending:
            start = max(0, len(pending) - 3)
            pending += data
            buf = pending
        else:
            start = 0
            buf = data
        sep = self._sep
        if sep is None:
            lf = buf.find(b"\n", start)
            if lf < 0:
                self._keep(buf)
                return b"", 0
            sep = self._sep = _CRLF_SEP if lf > 0 and buf[lf - 1] == 13 else _LF_SEP
            start = 0
        end = buf.rfind(sep, start)
        if end < 0:
            self._keep(buf)
            return b"", 0
        end += len(sep)
        if buf is data:
            complete = data if end == len(data) else data[:end]
            self._pending = bytearray(data[end:]) if end < len(data) else b""
        else:
            complete = bytes(buf[:end])
            del buf[:end]
            self._pending = buf if buf else b""
        if self._max_event is not None and len(self._pending) > self._max_event:
            self._too_large()
        return self._take(complete, sep)

    def _keep(self, buf: bytes | bytearray) -> None:
        self._pending = buf if isinstance(buf, bytearray) else bytearray(buf)
        if self._max_event is not None and len(buf) > self._max_event:
            self._too_large()

    def _too_large(self) -> None:
        """Drop the partial event (its memory is released) and fail the stream."""
        self._pending = b""
        raise UpstreamFailure("too_large", f"an SSE event exceeded max_event_bytes ({self._max_event} bytes)")

    def flush(self) -> tuple[bytes, int]:
        """At end of stream: the trailing bytes (an event missing its blank line), parsed
        leniently and forwarded as they are, after any events still held."""
        rest, self._pending = bytes(self._pending), b""
        sep = self._sep or _LF_SEP
        out, units = self._take(rest, sep) if rest else (b"", 0)
        if self._held is not None:
            out += self._rewritten(self._release(sep))
        return out, units

    def _take(self, complete: bytes, sep: bytes) -> tuple[bytes, int]:
        units = 0
        edited = False
        kept: list[bytes] = []
        events = complete.split(sep)
        trailer = events.pop()  # b"" after the last separator; or line ends alone, or (flush) a cut event
        if trailer and trailer.strip(b"\r\n"):
            events.append(trailer)
            trailer = b""
        failed = self.error is not None
        for event in events:
            if not event:  # a blank line more: kept, so an edit leaves the rest as it came
                if not failed:
                    kept.append(event)
                continue
            self.events += 1
            if event.startswith(_DATA) and 10 not in event and event != b"data: [DONE]":
                result = self._chunk(event[6:])  # the common one-line event, inline
            else:
                result, replaced = self._inspect(event, sep)
                if replaced is not None:
                    event, edited = replaced, True
            if failed or self.error is not None:  # nothing from an error on is forwarded
                failed, edited, self._strip = True, True, None
                continue
            if self._strip is not None:
                event = self._stripped()
                edited = True
            if self._held is not None and (result < 0 or self.done):
                kept.append(self._release(sep).removesuffix(sep))  # the usage chunk, or [DONE]: the held go first
                edited = True
            if result < 0:
                edited = True
                if result == _FOREIGN:  # not a chunk: forwarded redacted
                    kept.append(self._foreign(event, sep))
                continue
            units += result
            if self._held is not None or self._unstamped:
                self._hold(event)
                edited = True
                continue
            kept.append(event)
        if edited:
            complete = (sep.join(kept) + sep if kept else b"") + trailer
        return self._rewritten(complete), units

    def _rewritten(self, data: bytes) -> bytes:
        if self._rewrite is not None and data:
            for old, new in self._rewrite:
                data = data.replace(old, new)
        return data

    def release_held(self) -> bytes:
        """The events held back for a usage chunk that will not come (the upstream
        broke off), as they arrived; ``b""`` when none."""
        if self._held is None:
            return b""
        self._fingerprint = None
        return self._rewritten(self._release(self._sep or _LF_SEP))

    def _hold(self, event: bytes) -> None:
        """Keep ``event`` (without its separator) back until the usage chunk comes."""
        if self._held is None:
            self._held = []
        self._held.append((event, self._unstamped))
        self._unstamped = False

    def _release(self, sep: bytes) -> bytes:
        """The held events, each terminal chunk given the usage chunk's
        ``system_fingerprint`` (when it carried one), with their separators."""
        held, self._held = self._held or [], None
        stamp = None if self._fingerprint is None else b',"system_fingerprint":' + self._fingerprint + b"}"
        out = []
        for event, unstamped in held:
            if unstamped and stamp is not None and event.endswith(b"}"):
                event = event[:-1] + stamp
            out.append(event + sep)
        return b"".join(out)

    def _inspect(self, event: bytes, sep: bytes) -> tuple[int, bytes | None]:
        """Content units in one event that is not a lone ``data:`` line (-1: the event is
        dropped), and the event to forward instead when some of its bytes are not chunk
        data (``None``: as it is)."""
        newline = b"\r\n" if sep == _CRLF_SEP else b"\n"
        parts: list[bytes] = []
        name: bytes | None = None
        other = False
        for line in event.split(newline):
            if line.startswith(b"data:"):
                parts.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.startswith(b"event:") and name is None:
                name = line[7:] if line[6:7] == b" " else line[6:]
            elif line:
                other = True
        payload = b"\n".join(parts)
        if name == b"error":  # an in-band error, whatever its data says (plain text too)
            if not parts or self._chunk(payload) != -1 or self.error is None:
                text = payload.decode("utf-8", "replace").strip()
                self.error = self.error or {"message": text or "the upstream sent an error event"}
            return -1, None
        if not parts:  # comments, fields without data; line ends alone are as harmless as they came
            return 0, (self._foreign(event, sep) if event.strip(b"\r\n") else None)
        if payload == b"[DONE]":
            self.done = True
            result = 0
        else:
            self._kind = None
            result = self._chunk(payload)
            if result == _FOREIGN:
                return 0, self._foreign(event, sep)
        if other or (name is not None and (self._kind is None or name != self._kind.encode())):
            return result, self._foreign(event, sep, keep_data=True)
        return result, None

    def _foreign(self, event: bytes, sep: bytes, *, keep_data: bool = False) -> bytes:
        """``event`` (without its separator) as it may reach a client: each comment line
        a bare ``:``, each other line redacted (``keep_data``: its ``data`` lines, read
        as a chunk, as they are), lines ended in the stream's own line ending."""
        newline = b"\r\n" if sep == _CRLF_SEP else b"\n"
        lines: list[bytes] = []
        for line in _LINE_END.split(event):
            if not line:
                continue
            if line[0] == 58:  # ":", a comment
                if not lines or lines[-1] != b":":
                    lines.append(b":")
            elif keep_data and line.startswith(b"data:"):
                lines.append(line)
            else:
                lines.append(redact_text(line.decode("utf-8", "replace"), self._secrets).encode())
        return newline.join(lines) if lines else b":"

    def _stripped(self) -> bytes:
        """The chunk just parsed, re-encoded without its ``usage``."""
        chunk, self._strip = self._strip or {}, None
        del chunk["usage"]
        return b"data: " + orjson.dumps(chunk)

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
        if template is not None and template.matches(payload):
            self.content_chunks += 1
            return 1
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            try:  # bytes that are not UTF-8 (U+FFFD): an error event so written is still one
                chunk = orjson.loads(payload.decode("utf-8", "replace"))
            except orjson.JSONDecodeError:
                return _FOREIGN
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
            if self._text_error is not None and isinstance(delta, dict) and self._in_text_error(delta.get("content")):
                return -1
            if isinstance(delta, dict):
                if (
                    delta.get("content")
                    or delta.get("reasoning_content")
                    or delta.get("tool_calls")
                    or delta.get("reasoning")
                ):
                    units += 1
            elif choice.get("text"):
                units += 1
        self.content_chunks += units
        if usage and self._drop_usage:
            self._strip = chunk
        if units == 1 and self._learn and not usage and len(choices) == 1 and isinstance(delta, dict):
            self._learn -= 1
            self._template = ChunkTemplate.of(payload, delta) or self._template
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
    def separator(self) -> bytes:
        """The blank line ending this stream's events (``\\n\\n`` until one was seen)."""
        return self._sep or _LF_SEP

    @property
    def finished(self) -> bool:
        """Every choice seen has its ``finish_reason`` (a Responses stream: its terminal
        event came): the upstream said the answer is whole, ``[DONE]`` or not."""
        return self.finish_reason is not None and not self._open

    def done_event(self) -> bytes:
        """``data: [DONE]`` in the stream's own line endings, for an upstream that
        finished every choice and closed without it."""
        return b"data: [DONE]" + self.separator


def stream_unfinished(tap: StreamTap) -> tuple[str, str] | None:
    """Why a stream whose upstream body ended is not a whole answer, as ``(error kind,
    detail)``; ``None`` when it is (``[DONE]`` came, or every choice had its
    ``finish_reason``). The one classification of stream endings: a stream that closes
    (or whose chunked body is cut) after content with a choice still open is a failed
    request (``stream_unfinished``), whatever the framing said.
    """
    if tap.done or tap.finished:
        return None
    return "stream_unfinished", "the stream ended before its finish reason"
