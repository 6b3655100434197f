"""Server-sent events, decoded from raw bytes as they arrive from the network.

Implements the parsing rules of the WHATWG HTML spec ("Server-sent events", section
"Interpreting an event stream") restricted to what a chat completions client needs:
lines end with CRLF, LF or CR; ``data`` fields are collected, joined with ``\\n`` and
dispatched at the blank line that ends an event; comment lines (starting with ``:``)
and the other fields (``event``, ``id``, ``retry``) are ignored. OpenAI streams send
one ``data: {json}`` line per event and end with ``data: [DONE]``.

It works on bytes, not text: payloads go straight to ``orjson.loads``, so the client
spends as little time per chunk as possible.
"""

from __future__ import annotations


class SseDecoder:
    """Turns network reads of an event stream into the ``data`` payload of each event.

    ``feed(chunk)`` takes any slice of the byte stream (reads may split lines and
    events anywhere) and returns the payloads (``bytes``) of the events it completed.
    ``flush()`` at the end of the stream returns a last event not followed by a blank
    line (the spec discards it; lenient clients keep it, and so do we).

    Example::

        decoder = SseDecoder()
        decoder.feed(b'data: {"a": 1}\\n')  # -> []
        decoder.feed(b"\\n")                 # -> [b'{"a": 1}']
    """

    __slots__ = ("_data", "_pending", "_skip_lf")

    def __init__(self) -> None:
        self._data: list[bytes] = []
        self._pending = b""
        self._skip_lf = False  # the last read ended with CR: a leading LF completes that CRLF

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._skip_lf = False
        buffer = self._pending + chunk if self._pending else chunk
        if b"\r" in buffer:
            self._skip_lf = buffer.endswith(b"\r")
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._pending = lines.pop()
        events = []
        for line in lines:
            data = self._line(line)
            if data is not None:
                events.append(data)
        return events

    def flush(self) -> list[bytes]:
        """The payloads still pending when the stream ends; resets the decoder."""
        events = []
        if self._pending:
            self._line(self._pending)
            self._pending = b""
        data = self._dispatch()
        if data is not None:
            events.append(data)
        return events

    def _line(self, line: bytes) -> bytes | None:
        if not line:
            return self._dispatch()
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            self._data.append(b"")
        return None

    def _dispatch(self) -> bytes | None:
        if not self._data:
            return None
        data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        self._data = []
        return data or None  # an event whose data is empty is not dispatched
