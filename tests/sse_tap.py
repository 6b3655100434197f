"""Driving :class:`latgate.proxy.sse.StreamTap` the way the relay does: every read fed in
order, then a flush at the end of the stream."""

from __future__ import annotations

from collections.abc import Iterable

from latgate.proxy.sse import StreamTap


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
