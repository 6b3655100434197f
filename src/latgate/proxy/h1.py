"""latgate's own HTTP/1.1 upstream client: a keep-alive connection pool on asyncio
protocols, responses parsed by httptools (llhttp, the parser Node.js uses).

Why not aiohttp or httpx here: measured with ``benchmarks/overhead.py`` on this
project's 2-core machines, aiohttp's client was ~31% of a proxied request's CPU (its
request and response objects, header multidicts, timers and stream readers), and httpx's
default transport ~5x aiohttp's. Proxying one JSON POST and relaying its body needs far
less: write the request head and body in one ``transport.write``, feed what arrives to
llhttp, hand the body on as it comes, and keep the connection for the next request.

Protocol: RFC 9112 (HTTP/1.1 message syntax: ``Content-Length`` and chunked bodies,
close-delimited bodies, persistence), RFC 9110 section 9.2.2 (a request on a reused
connection that failed before any response byte is retried once on a new connection, as
browsers and urllib3 do: the server closed an idle connection as we wrote).

Timeouts: connect (TCP and TLS handshake, and the wait for a free pool slot) and read
(the longest silence while latgate waits for upstream bytes; time the client spends
not reading does not count). Every failure is an :class:`UpstreamFailure` whose message
names neither the URL nor any header.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ssl
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httptools

from latgate.proxy.errors import UpstreamFailure

#: Pause reading from an upstream when this many body bytes wait for the client.
HIGH_WATER_BYTES = 256 * 1024
#: An idle pooled connection older than this is closed, not reused (upstreams such as
#: uvicorn close idle keep-alive connections after 5 s).
KEEPALIVE_SECONDS = 4.0
#: A request that failed on a reused connection before any response byte is sent again
#: on a new one only if that connection had been idle this long: then the upstream most
#: likely closed it as idle while we wrote. A connection that dies right after reading a
#: request on a busy connection may have been processing it (a duplicate generation).
RETRY_IDLE_SECONDS = 1.0
#: Response head limits (aiohttp's are 8190 bytes a line, 32k fields; llhttp has none).
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADER_FIELDS = 256
#: When a response is closed before its end arrived (a stream's chunked terminator often
#: follows ``[DONE]`` in a separate write), wait this long and this much for the end,
#: then keep the connection; otherwise close it.
DRAIN_SECONDS = 0.05
DRAIN_BYTES = 64 * 1024


class Headers(dict[str, str]):
    """Response headers by lower-case name (repeated fields joined with ``", "``, RFC
    9110 section 5.3); ``get`` and ``[]`` accept any case."""

    __slots__ = ()

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())


class _Target:
    """One upstream URL, parsed once: origin key, request-target, Host and Basic auth."""

    __slots__ = ("auth", "host", "host_header", "key", "port", "request_target", "tls")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamFailure("request", "the upstream URL is not an http(s) URL")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        default_port = parts.port is None or parts.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.key = (parts.scheme, self.host, self.port)
        path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")  # non-ASCII as UTF-8 %XX
        self.request_target = path + (
            f"?{quote(parts.query, safe='/?%:@!$&()*+,;=-._~')}" if parts.query else ""
        )
        self.auth: str | None = None
        if parts.username is not None:
            userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.auth = "Basic " + base64.b64encode(userinfo.encode()).decode("ascii")


class _Trailing(Exception):
    """Raised inside a parser callback to stop at bytes after a complete response."""


class _Connection(asyncio.Protocol):
    """One upstream TCP (or TLS) connection and the response being read on it."""

    def __init__(self, pool: H1Pool, key: tuple[str, str, int]) -> None:
        self._pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self.reused_after_idle = False
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
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

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
            if self.complete:  # junk or a second response after this one: not ours
                self.keep_alive = False
                return
            self._fail(UpstreamFailure("read", "the upstream sent a malformed HTTP response"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self.headers_done and not self.complete and self._close_delimited():
            self.complete = True  # RFC 9112 6.3: the body ends where the connection does
            self.keep_alive = False
            self._wake()
        elif not self.complete:
            self._fail(UpstreamFailure("read", "upstream closed the connection"))

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

    def send(self, data: bytes, read_timeout_seconds: float | None) -> None:
        self._reset()
        self._parser = httptools.HttpResponseParser(self)
        self._read_timeout = read_timeout_seconds
        self._last_data_at = self._pool.loop.time()
        assert self.transport is not None
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
        due = self._last_data_at + self._read_timeout
        if self._pool.loop.time() >= due:
            self._fail(UpstreamFailure("timeout", "upstream timed out"))
            self.close()
        else:
            self._timer = self._pool.loop.call_at(due, self._check_silence)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class H1Response:
    """An upstream response whose status and headers arrived; the body streams.

    The slice of ``httpx.Response`` the forwarder reads: ``status_code``, ``headers``
    (:class:`Headers`), ``aiter_raw()`` (the body as it arrives, dechunked, undecoded),
    ``aread()``, ``aclose()`` (must be called: it returns the connection to the pool or
    closes it).
    """

    __slots__ = ("_conn", "_done", "headers", "status_code")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._done = False
        self.status_code = conn.status
        self.headers = conn.headers()

    def aiter_raw(self) -> H1Response:
        return self

    def __aiter__(self) -> H1Response:
        return self

    async def __anext__(self) -> bytes:
        """The next body bytes (all that arrived since the last call).

        Raises:
            StopAsyncIteration: the body is complete.
            UpstreamFailure: the connection broke, timed out or sent a malformed body.
        """
        conn = self._conn
        while True:
            if conn.has_body():
                return conn.take_body()
            if conn.complete:
                raise StopAsyncIteration
            if conn.error is not None:
                raise conn.error
            await conn.wait()

    async def aread(self) -> bytes:
        """The whole body.

        Raises:
            UpstreamFailure: as :meth:`__anext__`.
        """
        return b"".join([chunk async for chunk in self])

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._conn.finished()


class H1Pool:
    """Keep-alive HTTP/1.1 connections to every upstream, at most ``max_connections``.

    Args:
        connect_timeout_seconds: TCP connect plus TLS handshake, and the wait for a slot.
        ssl_context: for ``https`` upstreams (verification as the config says).
        max_connections: open connections across all upstreams.
    """

    def __init__(
        self, *, connect_timeout_seconds: float, ssl_context: ssl.SSLContext | None, max_connections: int
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self._connect_timeout = connect_timeout_seconds
        self._ssl = ssl_context
        self._max = max_connections
        self._open = 0
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._targets: dict[str, _Target] = {}
        self._all: set[_Connection] = set()
        self.retired = False

    async def post(
        self, *, url: str, payload: bytes, headers: dict[str, str], read_timeout_seconds: float | None
    ) -> H1Response:
        """POST ``payload`` to ``url``; return once the status line and headers arrived.

        Raises:
            UpstreamFailure: ``connect``, ``timeout``, ``read`` or ``request`` (a header
                with CR/LF or the URL not http(s)).
        """
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _Target(url)
        request = _request_bytes(target, payload, headers)
        for attempt in (1, 2):
            conn = await self._acquire(target)
            try:
                conn.send(request, read_timeout_seconds)
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait()
            except UpstreamFailure as failure:
                conn.close()
                if (
                    attempt == 1
                    and failure.kind == "read"
                    and conn.reused_after_idle
                    and not conn.received_any
                ):
                    continue  # the upstream closed an idle connection as we wrote to it
                raise
            except BaseException:
                conn.close()  # cancelled (first-token deadline, hedge lost, client left)
                raise
            return H1Response(conn)
        raise AssertionError("unreachable")

    async def _acquire(self, target: _Target) -> _Connection:
        """An idle connection to ``target``'s origin, else a new one; at the limit, an
        idle connection to another origin is closed, or the wait is for one to be
        released (bounded by the connect timeout)."""
        conn = self._idle_connection(target.key)
        if conn is not None:
            return conn
        if self._open >= self._max:
            try:
                async with asyncio.timeout(self._connect_timeout):
                    while self._open >= self._max and not self._evict_idle():
                        waiter = self.loop.create_future()
                        self._slot_waiters.append(waiter)
                        await waiter
                        conn = self._idle_connection(target.key)
                        if conn is not None:
                            return conn
            except TimeoutError:
                raise UpstreamFailure("timeout", "upstream timed out") from None
        return await self._connect(target)

    def _idle_connection(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = self.loop.time()
        while idle:
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > KEEPALIVE_SECONDS:
                conn.close()
                continue
            conn.reused = True
            conn.reused_after_idle = now - conn.idle_since >= RETRY_IDLE_SECONDS
            return conn
        return None

    def _evict_idle(self) -> bool:
        """Close the longest-idle connection, if any (frees a slot)."""
        oldest: _Connection | None = None
        for idle in self._idle.values():
            idle[:] = [conn for conn in idle if not conn.closed]
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is None:
            return False
        self._idle[oldest.key].remove(oldest)
        oldest.close()
        return True

    async def _connect(self, target: _Target) -> _Connection:
        self._open += 1
        conn = _Connection(self, target.key)
        self._all.add(conn)
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self.loop.create_connection(
                    lambda: conn,
                    target.host,
                    target.port,
                    ssl=(self._ssl or ssl.create_default_context()) if target.tls else None,
                    server_hostname=target.host if target.tls else None,
                )
        except BaseException as exc:
            conn.closed = True
            self.forget(conn)
            if isinstance(exc, TimeoutError):
                raise UpstreamFailure("timeout", "upstream timed out") from None
            if isinstance(exc, OSError):  # refused, reset, DNS, TLS (ssl.SSLError)
                raise UpstreamFailure("connect", "could not connect to upstream") from None
            raise
        return conn

    def keep(self, conn: _Connection) -> None:
        """Back to the idle list (called by a finished response)."""
        conn.idle_since = self.loop.time()
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake_one()

    def forget(self, conn: _Connection) -> None:
        """A connection closed: free its slot (idempotent)."""
        if conn in self._all:
            self._all.discard(conn)
            self._open -= 1
            self._wake_one()

    def _wake_one(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def retire(self) -> None:
        """A newer pool took over (a reload): close the idle connections now and each
        busy one when its response is done."""
        self.retired = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    def close(self) -> None:
        """Close every connection."""
        for conn in list(self._all):
            conn.close()
        self._idle.clear()


def _request_bytes(target: _Target, payload: bytes, headers: dict[str, str]) -> bytes:
    """The request head and body, one buffer (RFC 9112 section 3 and 6).

    Raises:
        UpstreamFailure: ``request`` when a header name or value holds CR, LF or NUL
            (it would split the request; e.g. a key pasted with its newline).
    """
    lines = [
        f"POST {target.request_target} HTTP/1.1",
        f"host: {target.host_header}",
        f"content-length: {len(payload)}",
    ]
    if target.auth is not None and "authorization" not in headers:
        lines.append(f"authorization: {target.auth}")
    for name, value in headers.items():
        lines.append(f"{name}: {value}")
    head = "\r\n".join(lines)
    crlf = len(lines) - 1
    if head.count("\r") != crlf or head.count("\n") != crlf or "\0" in head:
        # a CR, LF or NUL inside a name or value would split the request (e.g. a key
        # pasted with its newline)
        raise UpstreamFailure("request", "the request could not be sent (check the provider's key and URL)")
    return head.encode("utf-8") + b"\r\n\r\n" + payload
