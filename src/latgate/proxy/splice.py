"""The upstream body as the client's own bytes, with only what latgate changes spliced
in: for a body ``orjson`` parsed but cannot encode again (nested past its depth limit),
which would otherwise be refused; every other body is encoded from its parse
(:func:`latgate.proxy.wire.upstream_payload`).

:func:`splice` copies the client's bytes and replaces, inserts or removes only the
members whose value differs from what was parsed (the upstream model name of an alias,
``stream_options.include_usage`` on a stream, a provider's ``extra_body`` fields).

The client's bytes go at all only when their top-level members are exactly the parsed
body's keys (:func:`members_verified`): JSON allows duplicate names (RFC 8259 section 4
leaves their meaning open), the parser keeps the last, and an upstream that keeps the
first would otherwise act on another model, stream flag or prompt than the one latgate
routed, limited and counted. Checking that costs more than encoding the parsed body
(docs/performance.md), hence the order.

A member is replaced or removed in place only when it can be found unambiguously: its
key, spelled as ``orjson`` spells it, occurs exactly once in the body (a quote preceded
by an even number of backslashes is structural, RFC 8259 section 7, so a key cannot
hide inside a string) and the value found there reads back as the parsed value.
Otherwise :func:`splice` returns ``None``. New members go right after the opening brace
(member order carries no meaning in a JSON object, RFC 8259 section 4).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

#: At most this many occurrences of a key's text are examined before giving up.
MAX_KEY_OCCURRENCES = 16
#: A replaced or removed value longer than this is not looked for (it would be re-read).
MAX_SPLICED_VALUE_BYTES = 4096

_WS = b" \t\n\r"
_KEY_ESCAPE = re.compile(rb"\\(?:u00|/)")  # the only escapes that may spell an ASCII key
_SCALAR = re.compile(rb"-?[0-9][0-9.eE+-]*|true|false|null")


class ClientBody(dict):
    """A request body parsed from JSON (a plain ``dict`` of its members) that keeps the
    client's bytes (``raw``) and its top-level members as parsed (``sent``), so that
    :func:`splice` can tell what changed since. Weakly referable (a large body's
    memory is released off the event loop: :func:`latgate.api.largebody.release_when_freed`)."""

    __slots__ = ("__weakref__", "raw", "sent")

    def __init__(self, parsed: dict[str, Any], raw: bytes) -> None:
        super().__init__(parsed)
        self.raw = raw
        self.sent = parsed


def splice(body: ClientBody, out: dict[str, Any]) -> bytes | None:
    """``out`` (``body`` with some top-level members changed, added or removed) as JSON
    bytes: ``body.raw`` itself when nothing differs, else ``body.raw`` with only the
    differing members rewritten; ``None`` when a changed member cannot be located
    unambiguously (see the module docstring: the caller then encodes ``out`` whole).

    Raises:
        orjson.JSONEncodeError: a new value cannot be encoded.
    """
    sent, raw = body.sent, body.raw
    if not members_verified(raw, sent):
        return None
    edits: list[tuple[int, int, bytes]] = []  # (start, end, replacement) in raw
    inserted: list[bytes] = []
    removed = [key for key in sent if key not in out]
    for key, value in out.items():
        if key not in sent:
            inserted.append(orjson.dumps(key) + b":" + orjson.dumps(value))
            continue
        old = sent[key]
        if value is old or (type(value) is type(old) and value == old):
            continue
        span = _member(raw, key, old)
        if span is None:
            return None
        edits.append((span[1], span[2], orjson.dumps(value)))
    if len(removed) > 1:
        return None
    for key in removed:
        span = _member(raw, key, sent[key])
        if span is None:
            return None
        edits.append(_removal(raw, *span))
    if not edits and not inserted:
        return raw
    if inserted:
        brace = _skip_ws(raw, 0)
        if not sent or raw[brace : brace + 1] != b"{":
            return None
        edits.append((brace + 1, brace + 1, b",".join(inserted) + b","))
    edits.sort()
    parts, at = [], 0
    for start, end, replacement in edits:
        parts += (raw[at:start], replacement)
        at = end
    parts.append(raw[at:])
    return b"".join(parts)


def members_verified(raw: bytes, sent: dict[str, Any]) -> bool:
    """True when the top-level members of the JSON object ``raw`` are exactly the keys
    of ``sent`` (its parse), each once: every key's ``orjson`` spelling occurs exactly
    once anywhere in ``raw``, every key is ASCII and ``raw`` has no ``\\u00`` or
    ``\\/`` escape (the only other ways to spell an ASCII key). False is conservative:
    a key's name also nested or quoted in a text fails it too."""
    if _KEY_ESCAPE.search(raw) is not None:
        return False
    for key in sent:  # searched backwards: much faster than forwards on text full of quotes
        needle = orjson.dumps(key)
        last = raw.rfind(needle)
        if last < 0 or not key.isascii() or raw.rfind(needle, 0, last + len(needle) - 1) >= 0:
            return False
    return True


def _member(raw: bytes, key: str, value: Any) -> tuple[int, int, int] | None:
    """``(key_start, value_start, value_end)`` of the only member named ``key`` whose
    value reads back as ``value``; ``None`` when there is not exactly one such key."""
    needle = orjson.dumps(key)
    if not key.isascii() or b"\\u00" in raw or b"\\/" in raw:
        return None  # some key may spell an ASCII character with an escape: it could be this one
    found: tuple[int, int] | None = None
    at = raw.find(needle)
    for _ in range(MAX_KEY_OCCURRENCES):
        if at < 0:
            break
        if _structural(raw, at):
            colon = _skip_ws(raw, at + len(needle))
            if raw[colon : colon + 1] == b":":
                if found is not None:
                    return None  # the name is a key twice (nested, or duplicated): ambiguous
                found = (at, _skip_ws(raw, colon + 1))
        at = raw.find(needle, at + 1)
    else:
        return None
    if found is None:
        return None
    end = _value_end(raw, found[1])
    if end is None:
        return None
    try:
        again = orjson.loads(raw[found[1] : end])
    except orjson.JSONDecodeError:
        return None
    if type(again) is not type(value) or again != value:
        return None
    return (found[0], found[1], end)


def _structural(raw: bytes, quote: int) -> bool:
    """True when the quote at ``quote`` is not escaped (an even run of backslashes before it)."""
    run = 0
    while quote - run - 1 >= 0 and raw[quote - run - 1] == 0x5C:
        run += 1
    return run % 2 == 0


def _skip_ws(raw: bytes, at: int) -> int:
    while at < len(raw) and raw[at] in _WS:
        at += 1
    return at


def _value_end(raw: bytes, start: int) -> int | None:
    """The offset just past the JSON value starting at ``start``, for values of at most
    :data:`MAX_SPLICED_VALUE_BYTES`; ``None`` past that or when malformed."""
    first = raw[start : start + 1]
    if first == b'"':
        at = start
        while True:
            at = raw.find(b'"', at + 1, start + MAX_SPLICED_VALUE_BYTES)
            if at < 0:
                return None
            if _structural(raw, at):
                return at + 1
    if first in (b"{", b"["):
        depth, at, limit = 0, start, min(len(raw), start + MAX_SPLICED_VALUE_BYTES)
        while at < limit:
            byte = raw[at]
            if byte == 0x22:  # a string: skip to its closing quote
                end = _value_end(raw, at)
                if end is None:
                    return None
                at = end
                continue
            if byte in (0x7B, 0x5B):
                depth += 1
            elif byte in (0x7D, 0x5D):
                depth -= 1
                if depth == 0:
                    return at + 1
            at += 1
        return None
    match = _SCALAR.match(raw, start)
    return match.end() if match else None


def _removal(raw: bytes, key_start: int, value_start: int, value_end: int) -> tuple[int, int, bytes]:
    """The edit removing one member and the comma that separated it from a neighbour."""
    after = _skip_ws(raw, value_end)
    if raw[after : after + 1] == b",":
        return (key_start, after + 1, b"")
    before = key_start - 1
    while before >= 0 and raw[before] in _WS:
        before -= 1
    if raw[before : before + 1] == b",":
        return (before, value_end, b"")
    return (key_start, value_end, b"")  # the only member
