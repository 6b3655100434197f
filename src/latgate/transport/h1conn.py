"""One upstream HTTP/1.1 connection as an asyncio protocol (the response read on it:
:class:`~latgate.transport.h1response.H1Response`).

The wire is parsed by httptools (llhttp, the parser Node.js uses). Protocol: RFC 9112
(message syntax: ``Content-Length``, chunked and close-delimited bodies, persistence;
section 9.3.2: no pipelining, so bytes after a complete response are never part of it)
and RFC 9110 section 15.2 (1xx interim responses are skipped). The pool that owns the
connections is :mod:`latgate.transport.h1` (it is this module's :class:`ConnectionOwner`).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol, TypeVar, cast, overload

import httptools

from latgate.transport.errors import UpstreamFailure, client_certificate_alert, failure_cause

#: Pause reading from an upstream when this many body bytes wait for the client.
HIGH_WATER_BYTES = 256 * 1024
#: Response head limits (aiohttp's are 8190 bytes a line, 32k fields; llhttp has none).
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADER_FIELDS = 256
#: When a response is closed before its end arrived (a stream's chunked terminator often
#: follows ``[DONE]`` in a separate write), wait this long and this much for the end,
#: then keep the connection; otherwise close it.
DRAIN_SECONDS = 0.05
DRAIN_BYTES = 64 * 1024


_T = TypeVar("_T")
#: a pooled connection's key: its group (provider) and its target's origin, proxy and TLS
PoolKey = tuple[str, tuple[object, ...]]


class Headers(dict[str, str]):
    """Response headers by lower-case name (repeated fields joined with ``", "``, RFC
    9110 section 5.3); ``get`` and ``[]`` accept any case."""

    __slots__ = ()

    @overload
    def get(self, name: str, default: None = None, /) -> str | None: ...

    @overload
    def get(self, name: str, default: str, /) -> str: ...

    @overload
    def get(self, name: str, default: _T, /) -> str | _T: ...

    def get(self, name: str, default: object = None, /) -> object:
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())


class ConnectionOwner(Protocol):
    """What a connection needs of the pool that owns it (:class:`~latgate.transport.h1.H1Pool`).

    Attributes:
        loop: the event loop the connection runs on (its timers).
        retired: a newer pool took over: a finished connection is closed, not kept.
    """

    loop: asyncio.AbstractEventLoop
    retired: bool

    def keep(self, conn: H1Connection) -> None:
        """A finished response's connection, back to the idle list."""
        ...

    def forget(self, conn: H1Connection) -> None:
        """The connection closed: its slot is free (idempotent)."""
        ...


class _Trailing(Exception):
    """Raised inside a parser callback to stop at bytes after a complete response."""


class H1Connection(asyncio.Protocol):
    """One upstream TCP (or TLS) connection and the response being read on it."""

    def __init__(self, pool: ConnectionOwner, key: PoolKey) -> None:
        self._pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self.reused_after_idle = False
        self.reset_by_peer = False  # lost to a reset: the upstream closed with our bytes unread
        self._parser = httptools.HttpResponseParser(self)
        self._reset()

    # --- per response state ---------------------------------------------------------------

    def _reset(self) -> None:
        self.status = 0
        self.header_pairs: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._interim = False
        self._draining: asyncio.TimerHandle | None = None
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.received_any = False
        self.error: UpstreamFailure | None = None
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._read_timeout: float | None = None
        self._last_data_at = 0.0
        self._sent_at = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport: create_connection's

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        self._last_data_at = self._pool.loop.time()
        if self.complete:
            self.keep_alive = False  # bytes after a complete response: never reuse it
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamFailure("read", "the upstream switched protocols"))
            self.close()
        except httptools.HttpParserError:
            # feed_data's callbacks may have completed the response since the check above
            # (mypy keeps that check's narrowing across the call)
            if self.complete:  # junk or a second response after this one: not ours
                self.keep_alive = False  # type: ignore[unreachable]
                return
            self._fail(UpstreamFailure("read", "the upstream sent a malformed HTTP response"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reset_by_peer = isinstance(exc, ConnectionResetError)
        self._pool.forget(self)
        if self.headers_done and not self.complete and self._close_delimited():
            self.complete = True  # RFC 9112 6.3: the body ends where the connection does
            self.keep_alive = False
            self._wake()
        elif not self.complete:
            alert = None if self.received_any else client_certificate_alert(exc)
            if alert is not None:  # TLS 1.3: the server refused the client certificate after the handshake
                self._fail(UpstreamFailure("connect", f"could not connect to upstream: {alert}"))
                return
            cause = f": {failure_cause(exc)}" if exc is not None else ""
            self._fail(UpstreamFailure("read", f"upstream closed the connection{cause}"))

    # --- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            raise _Trailing  # a second response after ours (RFC 9112 9.3.2: no pipelining)

    def on_status(self, status: bytes) -> None:
        self._count_head(len(status))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        self.header_pairs.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): skip it
            self._interim = True
            self.header_pairs = []
            return
        self.status = status
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._draining is not None:
            self._buffered += len(body)
            if self._buffered > DRAIN_BYTES:
                self.close()
            return
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None
            self.finished()
            return
        self._wake()

    # --- used by H1Pool and H1Response ---------------------------------------------------

    def send(self, data: bytes | tuple[bytes, ...], read_timeout_seconds: float | None) -> None:
        """Write a request (its bytes, or its pieces in order) and start reading its answer."""
        self._reset()
        self._parser = httptools.HttpResponseParser(self)
        self._read_timeout = read_timeout_seconds
        self._last_data_at = self._sent_at = self._pool.loop.time()
        assert self.transport is not None
        if isinstance(data, tuple):
            for piece in data:
                self.transport.write(piece)
        else:
            self.transport.write(data)

    async def wait(self) -> None:
        """Until something changes (headers, body bytes, end, failure) or the read
        timeout passes in silence (then ``error`` is set)."""
        loop = self._pool.loop
        self._waiter = waiter = loop.create_future()
        if self._read_timeout is not None and self._timer is None:
            self._last_data_at = max(self._last_data_at, loop.time())
            self._timer = loop.call_at(self._last_data_at + self._read_timeout, self._check_silence)
        try:
            await waiter
        finally:
            self._waiter = None

    def take_body(self) -> bytes:
        body = self._body
        data = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return data

    def has_body(self) -> bool:
        return bool(self._body)

    def close(self) -> None:
        self._cancel_timer()
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()
        self._pool.forget(self)

    def finished(self) -> None:
        """The response is done with: keep the connection for the next one, or close it.

        A body whose end has not arrived yet gets :data:`DRAIN_SECONDS` and
        :data:`DRAIN_BYTES` to end (discarded) before the connection is closed."""
        self._cancel_timer()
        if self.closed or self.error is not None:
            self.close()
        elif self.complete:
            if self.keep_alive and not self._pool.retired:
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                self._pool.keep(self)
            else:
                self.close()
        elif self.headers_done and self._draining is None and not self._close_delimited():
            self._body.clear()
            self._buffered = 0
            if self._paused and self.transport is not None:
                self._paused = False
                self.transport.resume_reading()
            self._draining = self._pool.loop.call_later(DRAIN_SECONDS, self.close)
        else:
            self.close()

    def headers(self) -> Headers:
        fields: dict[str, list[str]] = {}
        for raw_name, raw_value in self.header_pairs:
            fields.setdefault(raw_name.decode("latin-1").lower(), []).append(raw_value.decode("latin-1"))
        headers = Headers()
        for name, values in fields.items():
            headers[name] = values[0] if len(values) == 1 else ", ".join(values)
        return headers

    # --- internals ------------------------------------------------------------------------

    def _count_head(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES or len(self.header_pairs) >= MAX_HEADER_FIELDS:
            self._fail(UpstreamFailure("read", "the upstream's response headers are too large"))
            raise _Trailing  # stop parsing; data_received closes the connection

    def _close_delimited(self) -> bool:
        for name, value in self.header_pairs:
            lowered = name.lower()
            if lowered == b"content-length" or (
                lowered == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                return False
        return True

    def _fail(self, failure: UpstreamFailure) -> None:
        if self.error is None:
            self.error = failure
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_silence(self) -> None:
        self._timer = None
        if self._waiter is None or self._read_timeout is None:
            return  # nobody waits: the client, not the upstream, is slow
        # the response head must be whole within the read timeout of sending (a head
        # trickled a byte at a time is never silent that long); the body, between reads
        due = (self._last_data_at if self.headers_done else self._sent_at) + self._read_timeout
        if self._pool.loop.time() >= due:
            if self.headers_done:
                which = "between reads"
            else:
                which = "no whole response head" if self.received_any else "no first byte"
            self._fail(UpstreamFailure("timeout", f"upstream timed out: {which}"))
            self.close()
        else:
            self._timer = self._pool.loop.call_at(due, self._check_silence)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
