"""RESP2, the Redis serialization protocol ("RESP protocol spec" in the Redis
documentation), as far as the store's commands need it: commands written as arrays of
bulk strings, replies read back (status, error, integer, bulk string, array), and Lua
scripts framed for ``EVALSHA``/``EVAL``. No I/O: :mod:`latgate.live.store.resp` owns the
connection.
"""

from __future__ import annotations

import hashlib
from typing import Any

#: deepest array nesting a reply may have: the store's commands answer with flat
#: arrays (``MGET``, its scripts' lists), so anything deeper is not theirs
MAX_REPLY_DEPTH = 4
#: what :func:`parse` returns while a reply's bytes are not all in yet
INCOMPLETE = object()


class RespError(Exception):
    """Redis could not be used: no connection, a closed one, or an error reply (the
    message is Redis's, which names no host)."""


class Script:
    """A Lua script, sent by its SHA-1 (``EVALSHA``) and by its text the first time a
    server does not know it (``NOSCRIPT``)."""

    def __init__(self, text: str) -> None:
        self.text = text.encode()
        self.sha = hashlib.sha1(self.text).hexdigest().encode()  # Redis names scripts by SHA-1
        self._heads: dict[int, bytes] = {}

    def evalsha(self, count: int) -> bytes:
        """The start of an ``EVALSHA`` of ``count`` arguments in all: up to the key count."""
        head = self._heads.get(count)
        if head is None:
            head = self._heads[count] = b"*%d\r\n$7\r\nEVALSHA\r\n%s" % (count, bulk(self.sha))
        return head

    def eval(self, count: int) -> bytes:
        """The same for ``EVAL`` with the script's text (after ``NOSCRIPT``)."""
        return b"*%d\r\n$4\r\nEVAL\r\n%s" % (count, bulk(self.text))


def bulk(data: bytes) -> bytes:
    """``data`` as one RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(data), data)


def encode(args: tuple[Any, ...]) -> bytes:
    """``args`` as one command: an array of bulk strings (a float by its ``repr``)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def parse(buffer: bytearray, at: int, depth: int = 0) -> tuple[Any, int]:
    """One reply starting at ``at``: ``(value, end)``, or ``(INCOMPLETE, at)``.

    An error reply is returned as a :class:`RespError` (not raised), a nil as ``None``.

    Raises:
        RespError: not RESP, or arrays nested deeper than :data:`MAX_REPLY_DEPTH`.
        ValueError: a length or integer that is not a number.
    """
    eol = buffer.find(b"\r\n", at)
    if eol < 0:
        return INCOMPLETE, at
    kind, line = buffer[at], bytes(buffer[at + 1 : eol])
    if kind == 0x2B:  # + status
        return line.decode(), eol + 2
    if kind == 0x2D:  # - error
        return RespError(line.decode(errors="replace")), eol + 2
    if kind == 0x3A:  # : integer
        return int(line), eol + 2
    if kind == 0x24:  # $ bulk string
        size = int(line)
        if size < 0:
            return None, eol + 2
        end = eol + 2 + size
        if len(buffer) < end + 2:
            return INCOMPLETE, at
        return bytes(buffer[eol + 2 : end]), end + 2
    if kind == 0x2A:  # * array
        count = int(line)
        if count < 0:
            return None, eol + 2
        if depth >= MAX_REPLY_DEPTH:
            raise RespError("Redis sent a reply nested deeper than the store's commands answer")
        items, pos = [], eol + 2
        for _ in range(count):
            item, pos = parse(buffer, pos, depth + 1)
            if item is INCOMPLETE:
                return INCOMPLETE, at
            items.append(item)
        return items, pos
    raise RespError("Redis sent a reply latgate cannot read")
