"""latgate's own HTTP/1.1 upstream client: a keep-alive connection pool on asyncio
protocols (each connection: :mod:`latgate.transport.h1conn`, parsed by httptools, the
llhttp parser Node.js uses; the response read on it: :mod:`latgate.transport.h1response`).

Why not aiohttp or httpx here: their request and response objects, header multidicts,
timers and stream readers were most of a proxied request's CPU (measured with
``benchmarks/overhead.py``: docs/performance.md, "Why the hot path is written as it
is"). Proxying one JSON POST and relaying its body needs far less: write the request head and body in one ``transport.write``, feed what arrives to
llhttp, hand the body on as it comes, and keep the connection for the next request.

Protocol: RFC 9112 (HTTP/1.1 message syntax: ``Content-Length`` and chunked bodies,
close-delimited bodies, persistence), RFC 9110 section 9.2.2 (a request on a reused
connection that failed before any response byte is retried once on a new connection, as
browsers and urllib3 do: the server closed an idle connection as we wrote; or it reset
the connection, so it had closed it unread, as after a redirect sent without
``connection: close``. A kept connection closed after the request was read is not: the
upstream may have been working on it).

Each provider's proxy (direct, absolute-form through an HTTP proxy, or a ``CONNECT``
tunnel) and TLS context come with its :class:`~latgate.transport.egress.Egress`
(:mod:`latgate.transport.tunnel`); connections are pooled per origin, proxy and TLS context.

Timeouts: connect (TCP and TLS handshake, and the wait for a free pool slot) and read
(the longest silence while latgate waits for upstream bytes; time the client spends
not reading does not count; the whole response head must arrive within it of sending). Every failure is an :class:`UpstreamFailure` whose message
names its cause (:func:`~latgate.transport.errors.failure_cause`: DNS, refused, reset, TLS
reason; timeout: connect, no first byte, no whole response head, between reads) and neither the URL nor any
header.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ssl
from urllib.parse import quote, unquote, urlsplit

from latgate.transport.egress import Egress
from latgate.transport.errors import LOCAL_ERRNOS, LOCAL_SHORTAGE, UpstreamFailure, connect_failure
from latgate.transport.h1conn import H1Connection, Headers, PoolKey
from latgate.transport.h1response import H1Response
from latgate.transport.tunnel import open_tunnel

__all__ = ["H1Pool", "H1Response", "Headers"]

#: An idle pooled connection older than this is closed, not reused (upstreams such as
#: uvicorn close idle keep-alive connections after 5 s).
KEEPALIVE_SECONDS = 4.0
#: A request that failed on a reused connection before any response byte is sent again
#: on a new one only if that connection had been idle this long: then the upstream most
#: likely closed it as idle while we wrote. A connection that dies right after reading a
#: request on a busy connection may have been processing it (a duplicate generation).
RETRY_IDLE_SECONDS = 1.0


class _Target:
    """One upstream URL, parsed once: origin key, request-target, Host and Basic auth,
    and how to reach it (direct, through a proxy, or a proxy's ``CONNECT`` tunnel; the
    TLS context) as its provider's :class:`~latgate.transport.egress.Egress` says."""

    __slots__ = (
        "address", "auth", "host", "host_header", "key", "port", "proxy_auth", "request_target", "ssl", "tls", "tunnel",
    )  # fmt: skip

    def __init__(self, url: str, egress: Egress | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamFailure("request", "the upstream URL is not an http(s) URL")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        default_port = parts.port is None or parts.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")  # non-ASCII as UTF-8 %XX
        self.request_target = path + (
            f"?{quote(parts.query, safe='/?%:@!$&()*+,;=-._~')}" if parts.query else ""
        )
        self.auth: str | None = None
        if parts.username is not None:
            userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.auth = "Basic " + base64.b64encode(userinfo.encode()).decode("ascii")
        self.address = (self.host, self.port)
        self.ssl = egress.ssl_context if egress is not None else None
        self.proxy_auth: str | None = None
        self.tunnel: bytes | None = None
        proxy = egress.proxy_for(parts.scheme, self.host, self.port) if egress is not None else None
        if proxy is not None:
            self.address = (proxy.host, proxy.port)
            if self.tls:  # RFC 9110 9.3.6: CONNECT host:port, TLS inside the tunnel
                authority = f"{host}:{self.port}"
                lines = [f"CONNECT {authority} HTTP/1.1", f"host: {authority}"]
                if proxy.authorization is not None:
                    lines.append(f"proxy-authorization: {proxy.authorization}")
                self.tunnel = ("\r\n".join(lines) + "\r\n\r\n").encode()
            else:  # RFC 9112 3.2.2: the absolute form, to the proxy
                self.request_target = f"http://{self.host_header}{self.request_target}"
                self.proxy_auth = proxy.authorization
        self.key = (parts.scheme, self.host, self.port, proxy, egress.tls_key if egress is not None else None)


class H1Pool:
    """Keep-alive HTTP/1.1 connections to every upstream, at most ``max_connections``
    per group (a provider: its endpoints share the group's connections).

    Args:
        connect_timeout_seconds: TCP connect plus TLS handshake, and the wait for a slot.
        ssl_context: for ``https`` upstreams (verification as the config says).
        max_connections: open connections per group unless :meth:`post` says otherwise.
    """

    def __init__(
        self, *, connect_timeout_seconds: float, ssl_context: ssl.SSLContext | None, max_connections: int
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self._connect_timeout = connect_timeout_seconds
        self._ssl = ssl_context
        self._max = max_connections
        self._open: dict[str, int] = {}
        self._idle: dict[PoolKey, list[H1Connection]] = {}
        self._slot_waiters: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._targets: dict[str, _Target] = {}
        self._all: set[H1Connection] = set()
        self.retired = False

    def open_connections(self) -> int:
        """Open connections (busy and idle) over every group."""
        return sum(self._open.values())

    def in_use(self) -> dict[str, int]:
        """Busy connections (open and not idle) by group."""
        busy = dict(self._open)
        for (group, _), idle in self._idle.items():
            busy[group] = busy.get(group, 0) - sum(1 for conn in idle if not conn.closed)
        return busy

    async def post(
        self,
        *,
        url: str,
        payload: bytes,
        headers: dict[str, str],
        read_timeout_seconds: float | None,
        egress: Egress | None = None,
        group: str = "",
        max_connections: int | None = None,
        method: str = "POST",
    ) -> H1Response:
        """POST ``payload`` to ``url`` on one of ``group``'s connections (at most
        ``max_connections``, else the pool's); return once the status line and headers
        arrived. ``egress``: the provider's proxy and TLS settings (``None``: direct,
        default TLS). ``method="GET"`` sends no body (``payload`` must be empty).

        Raises:
            UpstreamFailure: ``connect``, ``timeout``, ``read`` or ``request`` (a header
                with CR/LF or the URL not http(s)); ``overloaded``: the group's
                connections stayed busy for the connect timeout; ``local``: latgate
                had no descriptor for a new connection (neither is the upstream's fault).
        """
        targets = self._targets if egress is None else egress.targets
        target = targets.get(url)
        if target is None:
            target = targets[url] = _Target(url, egress)
        request = _request_bytes(target, payload, headers, method)
        limit = self._max if max_connections is None else max_connections
        for attempt in (1, 2):
            conn = await self._acquire(target, group, limit, fresh=attempt == 2)
            try:
                conn.send(request, read_timeout_seconds)
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error.fresh()
                    await conn.wait()
            except UpstreamFailure as failure:
                conn.close()
                if (
                    attempt == 1
                    and failure.kind == "read"
                    and conn.reused
                    and (conn.reused_after_idle or conn.reset_by_peer)
                    and not conn.received_any
                ):
                    continue  # the upstream had closed the kept connection as we wrote to it
                raise
            except BaseException:
                conn.close()  # cancelled (first-token deadline, hedge lost, client left)
                raise
            return H1Response(conn)
        raise AssertionError("unreachable")

    async def _acquire(self, target: _Target, group: str, limit: int, *, fresh: bool = False) -> H1Connection:
        """An idle connection to ``target``'s origin (unless ``fresh``), else a new one;
        at ``group``'s limit, an idle connection of the group to another origin is
        closed, or the wait is for one to be released (bounded by the connect timeout)."""
        key = (group, target.key)
        conn = None if fresh else self._idle_connection(key)
        if conn is not None:
            return conn
        if self._open.get(group, 0) >= limit:
            waiters = self._slot_waiters.setdefault(group, collections.deque())
            try:
                async with asyncio.timeout(self._connect_timeout):
                    while self._open.get(group, 0) >= limit and not self._evict_idle(group):
                        waiter = self.loop.create_future()
                        waiters.append(waiter)
                        await waiter
                        conn = None if fresh else self._idle_connection(key)
                        if conn is not None:
                            return conn
            except TimeoutError:
                raise UpstreamFailure(
                    "overloaded", f"latgate's connection pool for it is full ({limit} connections busy)"
                ) from None
        return await self._connect(target, key)

    def _idle_connection(self, key: PoolKey) -> H1Connection | None:
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

    def _evict_idle(self, group: str) -> bool:
        """Close the group's longest-idle connection, if any (frees a slot)."""
        oldest: H1Connection | None = None
        for (owner, _), idle in self._idle.items():
            if owner != group:
                continue
            idle[:] = [conn for conn in idle if not conn.closed]
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is None:
            return False
        self._idle[oldest.key].remove(oldest)
        oldest.close()
        return True

    async def _connect(self, target: _Target, key: PoolKey) -> H1Connection:
        group = key[0]
        self._open[group] = self._open.get(group, 0) + 1
        conn = H1Connection(self, key)
        self._all.add(conn)
        context = (target.ssl or self._ssl or ssl.create_default_context()) if target.tls else None
        try:
            async with asyncio.timeout(self._connect_timeout):
                if target.tunnel is not None:
                    assert context is not None
                    await open_tunnel(
                        self.loop, conn, proxy=target.address, request=target.tunnel, context=context, server_hostname=target.host
                    )
                else:
                    await self.loop.create_connection(
                        lambda: conn,
                        *target.address,
                        ssl=context,
                        server_hostname=target.host if target.tls else None,
                    )
        except BaseException as exc:
            conn.closed = True
            self.forget(conn)
            if isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS:
                raise UpstreamFailure("local", LOCAL_SHORTAGE) from None
            if isinstance(exc, OSError | TimeoutError | UpstreamFailure):  # refused, reset, DNS, TLS (ssl.SSLError)
                raise connect_failure(exc) from None
            raise
        return conn

    def keep(self, conn: H1Connection) -> None:
        """Back to the idle list (called by a finished response)."""
        conn.idle_since = self.loop.time()
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake_one(conn.key[0])

    def forget(self, conn: H1Connection) -> None:
        """A connection closed: free its slot (idempotent)."""
        if conn in self._all:
            self._all.discard(conn)
            group = conn.key[0]
            self._open[group] -= 1
            self._wake_one(group)

    def _wake_one(self, group: str) -> None:
        waiters = self._slot_waiters.get(group)
        while waiters:
            waiter = waiters.popleft()
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


#: Request bodies up to this size are sent in one write with their head.
JOIN_PAYLOAD_BYTES = 256 * 1024


def _request_bytes(
    target: _Target, payload: bytes, headers: dict[str, str], method: str = "POST"
) -> bytes | tuple[bytes, bytes]:
    """The request head and body (RFC 9112 section 3 and 6): one buffer, or ``(head,
    body)`` for a body over :data:`JOIN_PAYLOAD_BYTES` (written in turn, not copied).

    Raises:
        UpstreamFailure: ``request`` when a header name or value holds CR, LF or NUL
            (it would split the request; e.g. a key pasted with its newline).
    """
    lines = [f"{method} {target.request_target} HTTP/1.1", f"host: {target.host_header}"]
    if method != "GET":  # a GET has no body (RFC 9110 section 9.3.1): no length either
        lines.append(f"content-length: {len(payload)}")
    if target.auth is not None and "authorization" not in headers:
        lines.append(f"authorization: {target.auth}")
    if target.proxy_auth is not None:
        lines.append(f"proxy-authorization: {target.proxy_auth}")
    for name, value in headers.items():
        lines.append(f"{name}: {value}")
    head = "\r\n".join(lines)
    crlf = len(lines) - 1
    if head.count("\r") != crlf or head.count("\n") != crlf or "\0" in head:
        # a CR, LF or NUL inside a name or value would split the request (e.g. a key
        # pasted with its newline)
        raise UpstreamFailure("request", "the request could not be sent (check the provider's key and URL)")
    head_bytes = head.encode("utf-8") + b"\r\n\r\n"
    if len(payload) <= JOIN_PAYLOAD_BYTES:
        return head_bytes + payload
    # a large body is not copied once more on the event loop (time every other stream
    # waits, and its size again in memory): the head and the body are written in turn
    return (head_bytes, payload)
