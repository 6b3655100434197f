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
reads, CRLF across reads) forwards the same bytes, in order, unchanged, except for the
opt-in edits of :mod:`latgate.forwarding.sse_edits` (the usage-only chunk latgate asked
for dropped, the upstream model name rewritten back to the client's alias) and the
redaction of what is not chunk data. Lone-CR line endings are forwarded untouched but
not parsed (no known engine sends them).

The tap is three layers of one object: this module frames (boundaries, partial events,
the stream's separator, ``max_event_bytes``, the fields of a multi-line event),
:mod:`latgate.forwarding.sse_facts` reads each event's data (content units, usage, finish
reasons, errors), :mod:`latgate.forwarding.sse_edits` changes what is forwarded.

Nothing the tap did not read as a chunk reaches the client as the upstream wrote it:
an upstream's text there may echo its key (``: debug auth=Bearer sk-...``). A comment
is replaced by a bare ``:`` (it keeps an idle connection alive, its text means nothing
to a client); any other bytes of an event that are not chunk data (``event:``/``id:``
fields, empty ``data``, a JSON value that is no chunk, a CR that a client would read as
a line end) are forwarded redacted, their line endings normalised to the stream's own.
``data`` that is not JSON ends the stream as an in-band error (``stream_bad_event``): a
client could not read it. An ``event: error`` block is an in-band error whatever its
data (plain text too). The one field kept as written is a Responses stream's ``event:`` line naming
its data's ``type``.

Cost: reading events is the relay's per-token work, so the common case is kept to a
few byte comparisons. A read holding exactly one one-line event takes a fused path
(:meth:`StreamTap.feed`: no boundary search or split, the facts and edits inline);
every other read takes the composed one (:meth:`StreamTap.feed_framed`), with the
same result.
"""

from __future__ import annotations

from latgate.forwarding.sse_edits import _CRLF_SEP, _LF_SEP, StreamEdits
from latgate.forwarding.sse_facts import _FOREIGN, BAD_EVENT
from latgate.transport.errors import UpstreamFailure

_DATA = b"data: "


class StreamTap(StreamEdits):
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
        error_kind: ``decode_error`` for an error written into the text,
            ``stream_bad_event`` for data that is not JSON, else ``error_event``.
        events: complete events seen.
    """

    __slots__ = ("_max_event", "_pending")

    def __init__(
        self,
        *,
        drop_usage_chunk: bool = False,
        model_rewrite: tuple[str, str] | None = None,
        max_event_bytes: int | None = None,
        text_error: bytes | None = None,
        secrets: tuple[bytes, ...] = (),
    ) -> None:
        super().__init__(drop_usage_chunk=drop_usage_chunk, model_rewrite=model_rewrite, text_error=text_error, secrets=secrets)
        self._pending: bytearray | bytes = b""  # a partial event (a bytearray), or b"" for none
        self._max_event = max_event_bytes

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
        if (
            self._sep is _LF_SEP
            and not self._pending
            and self.error is None
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
            echoes = self._echoes  # the provider's key, should the upstream echo it (sse_edits)
            if echoes is not None and echoes.probe in data:
                data = echoes.scrubbed(data)
            return data, units
        return self.feed_framed(data)

    def feed_framed(self, data: bytes) -> tuple[bytes, int]:
        """:meth:`feed` without its fused path: the same result for any read, with the
        events found by the boundary search, split, and each read and edited on its own.
        :meth:`feed` takes it for every read but one holding exactly one one-line event
        (tests/test_sse_fused.py checks the two agree on any split of real streams)."""
        if self.error is not None:  # only looked at for [DONE] (it may span reads)
            seen = bytes(self._pending[-16:]) + data
            self.done = self.done or b"[DONE]" in seen
            self._pending = bytearray(seen[-16:])
            return b"", 0
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
            assert isinstance(buf, bytearray)  # the partial event kept, this read appended
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
            if parts and self.error is None:
                self._chunk(payload)  # a JSON error object is the error
                if self.error_kind == BAD_EVENT:  # plain text: an error event still, its text the message
                    self.error, self.error_kind = None, "error_event"
            if self.error is None:
                text = payload.decode("utf-8", "replace").strip()
                self.error = {"message": text or "the upstream sent an error event"}
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

    @property
    def separator(self) -> bytes:
        """The blank line ending this stream's events (``\\n\\n`` until one was seen)."""
        return self._sep or _LF_SEP

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
