"""Driving :class:`latgate.forwarding.sse.StreamTap` the way the relay does: every read fed in
order, then a flush at the end of the stream."""

from __future__ import annotations

import re
from collections.abc import Iterable

from latgate.forwarding.sse import StreamTap


def tap_pieces(pieces: Iterable[bytes], tap: StreamTap) -> tuple[bytes, int]:
    """Feed ``pieces`` (upstream reads, in order) to ``tap`` and flush it; returns the bytes
    it forwarded, joined, and the number of content units it counted."""
    out, units = [], 0
    for piece in pieces:
        data, n = tap.feed(piece)
        out.append(data)
        units += n
    data, n = tap.flush()
    out.append(data)
    return b"".join(out), units + n


def as_forwarded(body: bytes) -> bytes:
    """A well-formed upstream ``body`` as the tap forwards it: each comment line a bare
    ``:`` (its text, which may echo a key, never reaches a client), all else as it came."""
    return re.sub(rb"(?m)^:[^\r\n]*", b":", body)
