"""Where a non-streamed upstream answer's JSON begins, past the keep-alive bytes some
hosted upstreams write while they prefill (:class:`KeepalivePrelude`). The transport
reads it (:mod:`latgate.transport.upstream`), so it stands below the forwarding layer."""

from __future__ import annotations

#: bytes an upstream may send before a JSON answer to keep a connection alive: ASCII
#: whitespace (JSON's own, RFC 8259 section 2)
_JSON_WHITESPACE = frozenset(b" \t\r\n")


class KeepalivePrelude:
    """Finds where a non-streamed answer's JSON begins, past the keep-alive bytes some
    hosted upstreams write while they prefill: whitespace (valid before a JSON value,
    RFC 8259 section 2) and SSE-style comment lines (``: ping``, ``: OPENROUTER
    PROCESSING``; a line starting with ``:``, HTML Living Standard 9.2.6). Neither is
    the answer: the first-token deadline runs until its first real byte.

    Feed each read in turn; linear in the bytes fed (a comment line split across reads
    is carried as a flag, not re-scanned).

    Attributes:
        seen: keep-alive bytes skipped so far.
        found: the first real byte came.
    """

    __slots__ = ("_in_comment", "found", "seen")

    def __init__(self) -> None:
        self._in_comment = False
        self.found = False
        self.seen = 0

    def start(self, data: bytes) -> int:
        """The offset in ``data`` of the answer's first real byte, or -1 when every byte
        of it is still keep-alive (then read on)."""
        if data[:1] == b"{":  # the common answer: no keep-alives
            self.found = True
            return 0
        i, n = 0, len(data)
        while i < n:
            if self._in_comment:
                end = data.find(b"\n", i)
                if end < 0:
                    self.seen += n - i
                    return -1
                self._in_comment = False
                self.seen += end + 1 - i
                i = end + 1
                continue
            byte = data[i]
            if byte == 58:  # ":": a comment line, up to its LF
                self._in_comment = True
                continue
            if byte not in _JSON_WHITESPACE:
                self.found = True
                return i
            self.seen += 1
            i += 1
        return -1
