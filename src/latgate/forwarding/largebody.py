"""Large request bodies parsed and re-encoded in slices, off the event loop.

One 32 MB body of ~800k small messages takes orjson a few hundred milliseconds to parse
and as long again to re-encode for the upstream, all of it holding the GIL: every other
stream on the event loop stalls for that long. Bodies over :data:`LARGE_BODY_BYTES` are
instead parsed (:func:`parse_in_slices`) and encoded (:func:`dumps_in_slices`) in a
worker thread (``asyncio.to_thread``), one top-level array element or slice of
elements at a time, so the interpreter hands the GIL back to the event loop every
switch interval (``sys.getswitchinterval()``, 5 ms) instead of once at the end. The
big request itself takes longer; the others stop noticing it.

The JSON grammar is RFC 8259's, as orjson reads it: ``NaN``/``Infinity`` are refused
(the standard library would accept them).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import json
import queue
import re
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import orjson

#: Bodies larger than this are parsed off the event loop.
LARGE_BODY_BYTES = 1 << 20
#: String values up to this long are shared between array elements (roles, types).
SHARED_VALUE_CHARS = 16
#: Top-level arrays longer than this are encoded in slices of this many elements.
SLICE_ITEMS = 2048


def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` (``None`` elsewhere: musl, macOS)."""
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    return None


_TRIM = _malloc_trim()
_released: queue.SimpleQueue[list[list[Any]]] = queue.SimpleQueue()
_releaser_lock = threading.Lock()
_releaser: list[threading.Thread] = []
#: How long the releasing thread waits for a freed body's lists to lose their last
#: other reference (the body's own dealloc finishing on the event loop), in seconds.
RELEASE_WAIT_SECONDS = 0.01


def release_when_freed(body: Any) -> None:
    """Once ``body`` (a :class:`~latgate.api.body.ClientBody`) is freed, free its
    long top-level arrays a slice at a time in a worker thread, then hand the freed heap
    back to the operating system.

    Why: freeing a body of hundreds of thousands of messages is one C call holding the
    GIL (every element's dealloc) on whichever thread drops the last reference, the
    event loop's; sliced in a worker the interpreter can switch between slices. And when
    they are freed, glibc keeps the freed pages of its heap mapped, so the process's
    resident memory stays at its peak unless asked (``malloc_trim(3)``; ``ctypes``
    releases the GIL for the call; a no-op where the C library has none). An array
    some other object still holds after the body is gone is only let go of, untouched.
    """
    arrays = [value for value in body.values() if type(value) is list and len(value) > 2 * SLICE_ITEMS]
    if arrays or _TRIM is not None:
        weakref.finalize(body, _release_soon, arrays).atexit = False


def _release_soon(arrays: list[list[Any]]) -> None:
    _released.put(arrays)
    with _releaser_lock:
        if not _releaser:
            _releaser.append(threading.Thread(target=_releasing, name="latgate-body-release", daemon=True))
            _releaser[0].start()


def _releasing() -> None:
    while True:
        arrays = _released.get()
        with prompt_switching():
            while arrays:
                items = arrays.pop()
                waited = 0.0
                # 2: ``items`` and getrefcount's argument; more while the body's dealloc
                # has not finished, or while something else keeps the array
                while sys.getrefcount(items) > 2 and waited < RELEASE_WAIT_SECONDS:
                    time.sleep(0.001)
                    waited += 0.001
                if sys.getrefcount(items) == 2:
                    while items:
                        del items[-SLICE_ITEMS:]
                del items
        if _released.empty() and _TRIM is not None:
            _TRIM(0)


_SPACE = re.compile(r"[ \t\n\r]*")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)


#: The interpreter's switch interval while a large body is parsed or encoded (seconds).
SLICING_SWITCH_INTERVAL_SECONDS = 0.0005

_switching_lock = threading.Lock()
_switching = {"count": 0, "saved": 0.005}


@contextlib.contextmanager
def prompt_switching() -> Iterator[None]:
    """While inside, the interpreter offers the GIL every
    :data:`SLICING_SWITCH_INTERVAL_SECONDS` instead of every 5 ms: the event loop,
    waking for each event, waits at most that long for a worker thread slicing a
    body, instead of 5 ms per wake-up. Nested and concurrent uses restore the
    interval once the last one leaves."""
    with _switching_lock:
        if _switching["count"] == 0:
            _switching["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(SLICING_SWITCH_INTERVAL_SECONDS)
        _switching["count"] += 1
    try:
        yield
    finally:
        with _switching_lock:
            _switching["count"] -= 1
            if _switching["count"] == 0:
                sys.setswitchinterval(_switching["saved"])


def parse_in_slices(raw: bytes) -> Any:
    """See :func:`_parse_in_slices`; run with :func:`prompt_switching`."""
    with prompt_switching():
        return _parse_in_slices(raw)


def join_and_parse(chunks: list[bytes]) -> Any:
    """The received ``chunks`` joined (``chunks`` emptied), and parsed as
    :func:`parse_in_slices` does. Meant for a worker thread.

    Why: joining tens of megabytes is one copy, which ``bytes.join`` makes without the
    GIL; on the event loop it is still the loop's time, in a worker the loop runs
    meanwhile.

    Returns:
        The parsed value.

    Raises:
        ValueError: as :func:`parse_in_slices`.
    """
    raw = b"".join(chunks)
    chunks.clear()
    return parse_in_slices(raw)


#: Bytes decoded from UTF-8 at a time while a large body is parsed (cut back to a
#: character boundary).
DECODE_SLICE_BYTES = 1 << 20


_LOOKAHEAD_CHARS = 8


class _Window:
    """The text of ``raw`` decoded a slice at a time as the parse reaches it: ``text``
    holds what is not yet consumed, ``base`` the character offset of ``text[0]``.

    Why: decoding a whole body of tens of megabytes is one C call holding the GIL, and
    the str it makes is as large again; a slice at a time, the interpreter can switch
    between slices. Every slice ends before a byte that starts a character, so the
    slices decode exactly when the whole body does."""

    def __init__(self, raw: bytes) -> None:
        self.raw = memoryview(raw)
        self.decoded = 0  # bytes of raw decoded so far
        self.base = 0
        self.text = ""
        self.extend(0)

    @property
    def more(self) -> bool:
        return self.decoded < len(self.raw)

    def extend(self, at: int) -> int:
        """Drop ``text[:at]`` and append the next slice (at least as long as what is
        left, so that an element longer than a slice costs linear time); ``at``'s
        position in the new ``text`` (0).

        Raises:
            UnicodeDecodeError: the slice is not valid UTF-8.
        """
        raw, start = self.raw, self.decoded
        stop = min(len(raw), start + max(DECODE_SLICE_BYTES, len(self.text) - at))
        while stop < len(raw) and stop > start + 1 and raw[stop] & 0xC0 == 0x80:  # a continuation byte
            stop -= 1
        self.decoded = stop
        self.text = self.text[at:] + str(raw[start:stop], "utf-8")
        self.base += at
        return 0

    def space(self, at: int) -> int:
        """``at`` past any whitespace; below ``len(text)`` unless the body ends there."""
        while True:
            # _SPACE matches the empty string, so match() never returns None (no check per call)
            at = _SPACE.match(self.text, at).end()  # type: ignore[union-attr]
            if at < len(self.text) or not self.more:
                return at
            at = self.extend(at)

    def value(self, at: int) -> tuple[Any, int]:
        """The JSON value at ``at`` and the position after it, followed by at least
        :data:`_LOOKAHEAD_CHARS` characters unless the body ends sooner: a number cut
        by a slice's end reads as a shorter one (``-0.5`` of ``-0.5e+3``)."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, at)
            except json.JSONDecodeError as exc:
                if self.more:
                    at = self.extend(at)
                    continue
                raise ValueError(f"{exc.msg} at char {self.base + exc.pos}") from None
            if end + _LOOKAHEAD_CHARS <= len(self.text) or not self.more:
                return value, end
            at = self.extend(at)

    def expected(self, what: str, at: int) -> ValueError:
        return ValueError(f"expected {what} at char {self.base + at}")


def _parse_in_slices(raw: bytes) -> Any:
    """``raw`` parsed as JSON: a top-level object's array values element by element,
    anything else whole, decoded from UTF-8 a slice at a time (:class:`_Window`).
    Meant for a worker thread.

    Raises:
        ValueError: not UTF-8 (``UnicodeDecodeError``) or not valid JSON (message
            with the position).
    """
    window = _Window(raw)
    at = window.space(0)
    if not window.text.startswith("{", at):
        value, at = window.value(at)
        _at_end(window, at)
        return value
    out: dict[str, Any] = {}
    at = window.space(at + 1)
    if window.text.startswith("}", at):
        _at_end(window, at + 1)
        return out
    while True:
        key, at = window.value(at)
        if not isinstance(key, str):
            raise window.expected("a string key", at)
        at = window.space(at)
        if not window.text.startswith(":", at):
            raise window.expected("':'", at)
        at = window.space(at + 1)
        if window.text.startswith("[", at):
            out[key], at = _array(window, at + 1)
        else:
            out[key], at = window.value(at)
        at = window.space(at)
        if window.text.startswith(",", at):
            at = window.space(at + 1)
            continue
        if window.text.startswith("}", at):
            _at_end(window, at + 1)
            return out
        raise window.expected("',' or '}'", at)


def _array(window: _Window, at: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    at = window.space(at)
    if window.text.startswith("]", at):
        return items, at + 1
    shared: dict[str, str] = {}  # one string for each key and short value seen again
    while True:
        item, at = window.value(at)
        items.append(_share(item, shared) if type(item) is dict else item)
        if len(items) == SLICE_ITEMS:
            # a young list is traversed, every element, by each young collection until
            # one promotes it; a long array traversed while holding the GIL stalls the
            # event loop. Promoted to the oldest generation while it is short, it is
            # left to full collections.
            gc.collect(1)
        at = window.space(at)
        if window.text.startswith(",", at):
            at = window.space(at + 1)
        elif window.text.startswith("]", at):
            return items, at + 1
        else:
            raise window.expected("',' or ']'", at)


def _share(item: dict[str, Any], shared: dict[str, str]) -> dict[str, Any]:
    """``item`` with its keys, and its short string values, taken from ``shared``.

    The decoder shares repeated keys only within one call, and each array element is
    its own call: without this every message would hold its own ``"role"``,
    ``"content"`` and ``"user"`` strings."""
    out = {}
    for key, value in item.items():
        if type(value) is str and len(value) <= SHARED_VALUE_CHARS:
            value = shared.setdefault(value, value)
        out[shared.setdefault(key, key)] = value
    return out


def _at_end(window: _Window, at: int) -> None:
    if window.space(at) != len(window.text):
        raise ValueError(f"extra data at char {window.base + at}")


def is_large(body: dict[str, Any]) -> bool:
    """True when a top-level array of ``body`` is long enough to encode in slices."""
    for value in body.values():  # a loop, not any() over a generator: asked twice per request
        if isinstance(value, list) and len(value) > 2 * SLICE_ITEMS:
            return True
    return False


def dumps_in_slices(body: dict[str, Any]) -> bytes:
    """See :func:`_dumps_in_slices`; run with :func:`prompt_switching`."""
    with prompt_switching():
        return _dumps_in_slices(body)


def _dumps_in_slices(body: dict[str, Any]) -> bytes:
    """``orjson.dumps(body)``, long top-level arrays a slice at a time (the same bytes).

    Raises:
        orjson.JSONEncodeError: as ``orjson.dumps``.
    """
    parts = [b"{"]
    for index, (key, value) in enumerate(body.items()):
        if index:
            parts.append(b",")
        parts.append(orjson.dumps(key) + b":")
        if isinstance(value, list) and len(value) > SLICE_ITEMS:
            pieces = [orjson.dumps(value[i : i + SLICE_ITEMS])[1:-1] for i in range(0, len(value), SLICE_ITEMS)]
            parts.append(b"[" + b",".join(piece for piece in pieces if piece) + b"]")
        else:
            parts.append(orjson.dumps(value))
    parts.append(b"}")
    return b"".join(parts)
