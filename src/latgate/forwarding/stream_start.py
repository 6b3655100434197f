"""What a stream sends before its first content must be an event stream: the check
that refuses an HTML error page, a JSON body or random bytes answered as
``text/event-stream`` before any of it reaches the client.

Format: the HTML Living Standard, "Server-sent events" (9.2.6, interpreting an event
stream).
"""

from __future__ import annotations

#: the fields of the SSE format (HTML Living Standard 9.2.6); any other is not what an
#: engine or hosted API sends
_FIELDS = (b"data", b"event", b"id", b"retry")
_UTF8_BOM = b"\xef\xbb\xbf"


class StreamStart:
    """Checks that the bytes a stream sends before its first content are an event
    stream: each line blank, a comment (``:``...) or one of the SSE fields ``data``,
    ``event``, ``id``, ``retry`` (HTML Living Standard 9.2.6; a leading UTF-8 BOM is
    allowed). An HTML error page, a JSON body or random bytes sent as
    ``text/event-stream`` fail it at their first line, even before it ends.

    Only the bytes before the first content are fed (the relay never calls it), so
    streams that are well formed pay one line scan of their first reads. Each line is
    judged from its first 7 bytes at most, so state across reads is a few bytes.

    Attributes (after :meth:`feed` returned an offset):
        what: ``"an HTML page"``, ``"a JSON body"`` or ``"other bytes"``, from the
            first byte of that line that is not whitespace.
    """

    __slots__ = ("_head", "_judged", "_started", "what")

    def __init__(self) -> None:
        self._head = b""  # the current line's first bytes, while not judged yet
        self._judged = False  # the current line's start was found plausible
        self._started = False  # past a leading BOM
        self.what = ""

    def feed(self, data: bytes) -> int:
        """The offset in ``data`` of the line that is not SSE, or -1 while it all is."""
        pos, n = 0, len(data)
        if not self._started:
            held = len(self._head)  # the start of a BOM split across reads
            data = self._head + data
            if len(data) < 3 and _UTF8_BOM.startswith(data):
                self._head = data
                return -1
            self._started, self._head = True, b""
            if data.startswith(_UTF8_BOM):
                pos = 3
            found = self.feed(data[pos:])
            return found if found < 0 else max(0, found + pos - held)
        while pos < n:
            newline = data.find(b"\n", pos)
            if self._judged:
                if newline < 0:
                    return -1
                self._judged, pos = False, newline + 1
                continue
            end = n if newline < 0 else newline
            head = self._head + data[pos : min(end, pos + 7)]
            verdict = _line_verdict(head[:7], complete=newline >= 0 and len(self._head) + end - pos < 7)
            if verdict is False:
                self.what = _what(head.lstrip(b" \t\r")[:1])
                return max(0, pos - len(self._head))
            self._head = b""
            if verdict is None:  # too few bytes of the line yet
                self._head = head
                return -1
            if newline < 0:
                self._judged = True
                return -1
            pos = newline + 1
        return -1


def _line_verdict(head: bytes, *, complete: bool) -> bool | None:
    """Whether a line starting with ``head`` (its whole self when ``complete``) is SSE;
    ``None``: not known from so few bytes."""
    line = head.rstrip(b"\r")  # a CR ends a line, or starts its CRLF
    if not line or line[0] == 58:  # blank, or a comment (58: ":")
        return True
    colon = line.find(b":")
    if colon >= 0:
        return line[:colon] in _FIELDS
    if complete:
        return line in _FIELDS  # a field without a value
    if len(line) > 5:  # longer than every field name, and no colon
        return False
    return None if any(field.startswith(line) for field in _FIELDS) else False  # "data" may go on as "datax"


def _what(first: bytes) -> str:
    if first == b"<":
        return "an HTML page"
    if first in (b"{", b"["):
        return "a JSON body"
    return "other bytes"
