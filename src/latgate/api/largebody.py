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
    """Once ``body`` (a :class:`~latgate.proxy.splice.ClientBody`) is freed, free its
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


def _parse_in_slices(raw: bytes) -> Any:
    """``raw`` parsed as JSON: a top-level object's array values element by element,
    anything else whole. Meant for a worker thread.

    Raises:
        ValueError: not UTF-8 (``UnicodeDecodeError``) or not valid JSON (message
            with the position).
    """
    text = raw.decode("utf-8")
    at = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("{", at):
        value, end = _DECODER.raw_decode(text, at)
        _at_end(text, end)
        return value
    out: dict[str, Any] = {}
    at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    if text.startswith("}", at):
        _at_end(text, at + 1)
        return out
    while True:
        key, at = _DECODER.raw_decode(text, at)
        if not isinstance(key, str):
            raise ValueError(f"expected a string key at char {at}")  # noqa: TRY004 (invalid JSON, like the others)
        at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
        if not text.startswith(":", at):
            raise ValueError(f"expected ':' at char {at}")
        at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
        if text.startswith("[", at):
            out[key], at = _array(text, at + 1)
        else:
            out[key], at = _DECODER.raw_decode(text, at)
        at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
        if text.startswith(",", at):
            at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
            continue
        if text.startswith("}", at):
            _at_end(text, at + 1)
            return out
        raise ValueError(f"expected ',' or '}}' at char {at}")


def _array(text: str, at: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
    if text.startswith("]", at):
        return items, at + 1
    shared: dict[str, str] = {}  # one string for each key and short value seen again
    while True:
        item, at = _DECODER.raw_decode(text, at)
        items.append(_share(item, shared) if type(item) is dict else item)
        at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
        if text.startswith(",", at):
            at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
        elif text.startswith("]", at):
            return items, at + 1
        else:
            raise ValueError(f"expected ',' or ']' at char {at}")


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


def _at_end(text: str, at: int) -> None:
    if _SPACE.match(text, at).end() != len(text):  # type: ignore[union-attr]
        raise ValueError(f"extra data at char {at}")


def is_large(body: dict[str, Any]) -> bool:
    """True when a top-level array of ``body`` is long enough to encode in slices."""
    return any(isinstance(value, list) and len(value) > 2 * SLICE_ITEMS for value in body.values())


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
