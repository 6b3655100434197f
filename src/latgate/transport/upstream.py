"""The one pooled upstream client, over the one upstream interface.

The interface is two protocols of plain primitives: an :class:`UpstreamTransport`
sends one request and returns an :class:`UpstreamResponse` once its status line and
headers arrived (status, headers, the body as an async byte iterator, close).
:class:`UpstreamClient` is the same code over any transport: in production latgate's own
HTTP/1.1 pool (:class:`~latgate.transport.h1.H1Pool`: asyncio protocols and httptools);
in tests a loopback server behind that pool, or an in-memory transport passed as
``transport=``. What the client adds applies over every transport: each provider's
proxy and TLS settings passed on (:mod:`latgate.transport.egress`), a same-origin 307/308
followed, a compressed answer decoded (:mod:`latgate.transport.decoding`), foreign
exceptions translated. Proxied requests are :meth:`UpstreamClient.open`; everything
else (health probes, engine load and catalog reads, ``latgate check --probe``) is a
small GET (:meth:`UpstreamClient.get`) on the same transport.

httpx is not on this path (its client cost several times latgate's pool per request:
docs/performance.md); it stays a dependency of the CLI (``latgate route --url``) and of
the tests' clients.

Every exception of asyncio or the OS raised while talking to an upstream becomes an
:class:`UpstreamFailure` (:func:`~latgate.transport.errors.as_upstream_failure`: around
each request here, around reads with :func:`~latgate.transport.errors.upstream_errors`),
with a ``kind`` used as the ``latgate_upstream_errors_total`` label. Its message never
contains the upstream URL or key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import SplitResult, urljoin, urlsplit

from latgate import __version__
from latgate.transport.decoding import MAX_DECODED_BYTES, DecodedResponse, decoder_problem
from latgate.transport.egress import Egress, default_tls_context
from latgate.transport.errors import UpstreamFailure, as_upstream_failure, upstream_errors
from latgate.transport.h1 import H1Pool
from latgate.transport.prelude import KeepalivePrelude

__all__ = [
    "Fetched",
    "UpstreamClient",
    "UpstreamFailure",
    "UpstreamResponse",
    "UpstreamTransport",
    "read_at_most",
    "upstream_errors",
    "upstream_headers",
]

USER_AGENT = f"latgate/{__version__}"
#: Redirects that keep the method and body (RFC 9110 sections 15.4.8 and 15.4.9): one is
#: followed when it stays on the same origin. Others (301, 302, 303) are not answers.
SAME_ORIGIN_REDIRECTS = frozenset({307, 308})


class UpstreamResponse(Protocol):
    """An upstream's answer whose status line and headers arrived; its body streams.

    Attributes:
        status_code: the final status (1xx interim answers are skipped).
        headers: the header fields by lower-case name, a repeated field's values joined
            with ``", "`` (RFC 9110 section 5.3).
        followed: the URL of the same-origin redirect followed to get it (set by
            :class:`UpstreamClient`; ``None`` as a transport returns it).
    """

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    followed: str | None

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives: dechunked, not decoded (``content-encoding`` kept),
        each read all that came since the last.

        Raises:
            UpstreamFailure: the connection broke, timed out or sent a malformed body.
        """
        ...

    async def aclose(self) -> None:
        """Done with it (it must be called): its connection is kept for the next request
        or closed. Idempotent."""
        ...

    def close_connection(self) -> None:
        """Done with it, its connection closed rather than kept (a redirect's: its
        upstream often closes it without saying so). Idempotent."""
        ...


class UpstreamTransport(Protocol):
    """Sends one request to an upstream and returns its :class:`UpstreamResponse`.

    latgate's is :class:`~latgate.transport.h1.H1Pool`; a test's may answer from memory.
    """

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
    ) -> UpstreamResponse:
        """Send ``payload`` (JSON bytes; empty for ``method="GET"``) to ``url`` with
        ``headers``, on one of ``group``'s (a provider's) connections, at most
        ``max_connections`` of them; return once the status and headers arrived.
        ``read_timeout_seconds``: the longest upstream silence. ``egress``: the
        provider's proxy and TLS settings (``None``: direct, default TLS).

        Raises:
            UpstreamFailure: no response could be had (other exceptions are translated
                by the client, :func:`as_upstream_failure`).
        """
        ...

    def in_use(self) -> dict[str, int]:
        """Busy connections by group."""
        ...

    def retire(self) -> None:
        """A newer transport took over: idle connections close now, busy ones when done."""
        ...

    def close(self) -> None:
        """Close every connection; later requests fail (``local``)."""
        ...


@dataclass(frozen=True, slots=True)
class Fetched:
    """A small GET's whole answer (:meth:`UpstreamClient.get`).

    Attributes:
        status_code: its status.
        headers: its header fields by lower-case name.
        content: its body (not decoded: the GET asks for ``identity``).
    """

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        """The body as UTF-8 (undecodable bytes replaced)."""
        return self.content.decode("utf-8", "replace")

    @property
    def is_success(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status_code < 300


def same_origin_location(url: str, location: str | None) -> str | None:
    """``location`` resolved against ``url`` when it is on the same origin (scheme, host
    and port, RFC 6454), else ``None``: the provider's key is never sent to another host."""
    if not location:
        return None
    target = urljoin(url, location.strip())
    a, b = urlsplit(url), urlsplit(target)
    try:
        same = (a.scheme, a.hostname, _port(a)) == (b.scheme, b.hostname, _port(b))
    except ValueError:  # a port that is not a number
        return None
    if not same or b.username is not None or b.password is not None:
        return None
    return target.split("#", 1)[0]


def _port(parts: SplitResult) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


async def read_at_most(
    response: UpstreamResponse,
    limit: int,
    *,
    prelude: KeepalivePrelude | None = None,
) -> bytes:
    """The whole body of ``response``, at most ``limit`` bytes. ``prelude``: keep-alives
    before the body's first real byte are skipped (not kept, not counted).

    Raises:
        UpstreamFailure: ``too_large`` as soon as the declared (``content-length``) or
            received size passes ``limit`` (what was read is dropped); others as the
            body's reads raise them.
    """
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise UpstreamFailure("too_large", f"its answer of {int(declared)} bytes exceeds max_response_bytes ({limit})")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        if prelude is not None:
            start = prelude.start(chunk)
            if start < 0:
                continue  # keep-alives only
            if start:
                chunk = chunk[start:]
            prelude = None
        size += len(chunk)
        if size > limit:
            chunks.clear()
            raise UpstreamFailure("too_large", f"its answer exceeds max_response_bytes ({limit} bytes)")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class UpstreamClient:
    """One pooled HTTP client per process for every provider, over one transport.

    Args:
        connect_timeout_seconds: TCP/TLS connect (and pool wait) limit.
        read_timeout_seconds: the longest silence allowed between two reads.
        transport: carries every request (tests: an in-memory one); by default
            latgate's own :class:`~latgate.transport.h1.H1Pool`, opened at the first request.
        max_connections: connections per provider on latgate's pool when a request gives
            no limit of its own (and of the GETs, over every upstream).
        verify: TLS verification for https upstreams (on by default; the roots:
            :func:`~latgate.transport.egress.default_tls_context`).
    """

    def __init__(
        self,
        *,
        connect_timeout_seconds: float,
        read_timeout_seconds: float,
        transport: UpstreamTransport | None = None,
        max_connections: int = 1000,
        verify: bool = True,
    ) -> None:
        self._transport = transport
        self._connect_timeout = connect_timeout_seconds
        self._read_timeout = read_timeout_seconds
        self._max_connections = max_connections
        self._closed = False
        # Made here, not at the first request: loading the CA bundle takes tens of ms,
        # which would count against the first upstream's measured latency.
        self._ssl_context = default_tls_context(verify=verify) if transport is None else None

    async def open(
        self,
        *,
        url: str,
        payload: bytes,
        headers: dict[str, str],
        read_timeout_seconds: float | None = None,
        egress: Egress | None = None,
        group: str = "",
        max_connections: int | None = None,
        max_decoded_bytes: int = MAX_DECODED_BYTES,
    ) -> UpstreamResponse:
        """POST ``payload`` (JSON bytes) to ``url`` and return once the status and headers
        arrived; the body is left to stream (``aiter_raw``; the caller must ``aclose``).
        ``egress``: the provider's proxy and TLS settings (``None``: direct with the
        default TLS context). The connection is one of ``group``'s (a provider's), at
        most ``max_connections`` of them (see :class:`~latgate.transport.h1.H1Pool`). A
        compressed body decodes to at most ``max_decoded_bytes``
        (:class:`~latgate.transport.decoding.DecodedResponse`).

        Raises:
            UpstreamFailure: no response could be had.
        """
        slot = (group, max_connections)
        response = await self._send(url, payload, headers, read_timeout_seconds, egress, slot)
        if response.status_code in SAME_ORIGIN_REDIRECTS or "content-encoding" in response.headers:
            return await self._unusual(response, url, payload, headers, read_timeout_seconds, egress, slot, max_decoded_bytes)
        return response

    async def _unusual(
        self,
        response: UpstreamResponse,
        url: str,
        payload: bytes,
        headers: dict[str, str],
        read_timeout_seconds: float | None,
        egress: Egress | None,
        slot: tuple[str, int | None],
        max_decoded_bytes: int = MAX_DECODED_BYTES,
    ) -> UpstreamResponse:
        """A same-origin 307/308 followed once (method and body kept, RFC 9110 section
        15.4.8/15.4.9), unless it names ``url`` itself (a loop: returned as it is, for
        the caller to report); a compressed body decoded (:mod:`latgate.transport.decoding`)."""
        if response.status_code in SAME_ORIGIN_REDIRECTS:
            location = same_origin_location(url, response.headers.get("location"))
            if location is not None and location != url:
                response.close_connection()  # the follow-up goes on a new connection
                response = await self._send(location, payload, headers, read_timeout_seconds, egress, slot)
                response.followed = location  # a redirect from here is a second one (failures.redirect_refused)
        encoding = response.headers.get("content-encoding")
        if encoding is None:
            return response
        problem = decoder_problem(encoding)
        if problem is not None:
            await response.aclose()
            raise UpstreamFailure("read", problem)
        return DecodedResponse(
            status_code=response.status_code, headers=response.headers, body=response.aiter_raw(), close=response.aclose,
            close_connection=response.close_connection, content_encoding=encoding, max_decoded_bytes=max_decoded_bytes,
            followed=response.followed,
        )  # fmt: skip

    async def _send(
        self,
        url: str,
        payload: bytes,
        headers: dict[str, str],
        read_timeout_seconds: float | None,
        egress: Egress | None,
        slot: tuple[str, int | None] = ("", None),
        method: str = "POST",
    ) -> UpstreamResponse:
        """One request on the transport; ``slot``: the pool group (provider) and its
        connection limit."""
        transport = self._transport
        if transport is None or self._closed:  # the first request, or after aclose: fails
            transport = self._transport = self._pool()
        try:
            return await transport.post(
                url=url, payload=payload, headers=headers,
                read_timeout_seconds=self._read_timeout if read_timeout_seconds is None else read_timeout_seconds,
                egress=egress, group=slot[0], max_connections=slot[1], method=method,
            )  # fmt: skip
        except (OSError, ValueError) as exc:  # a transport's own exception (latgate's raises UpstreamFailure)
            raise as_upstream_failure(exc) from None

    async def get(self, *, url: str, headers: dict[str, str], timeout_seconds: float, egress: Egress | None = None) -> Fetched:
        """A small GET (health probes, engine metrics and catalogs, ``check --probe``),
        body read (uncompressed: ``accept-encoding: identity``), on the same transport
        as proxied requests, its connections shared by every upstream (no provider's
        connection limit is taken), through the proxy and with the TLS settings of
        ``egress`` (the provider's) as proxied requests are.

        Why not httpx: a GET through httpx's client cost ~0.3 ms of CPU on a kept
        connection and ~0.8 ms on a new one; with hundreds of idle endpoints probed
        that was a share of every proxied request (docs/performance.md).

        Raises:
            UpstreamFailure: no response could be had.
        """
        sent = {"accept-encoding": "identity", "user-agent": USER_AGENT, **headers}
        response = await self._send(url, b"", sent, timeout_seconds, egress, method="GET")
        try:
            with upstream_errors():
                body = b"".join([chunk async for chunk in response.aiter_raw()])
        finally:
            await response.aclose()
        return Fetched(response.status_code, response.headers, body)

    def _pool(self) -> H1Pool:
        """latgate's own pool, opened at the first request (it needs the running loop)."""
        if self._closed:
            raise UpstreamFailure("local", "latgate's upstream client is closed (shutting down)")
        return H1Pool(connect_timeout_seconds=self._connect_timeout, ssl_context=self._ssl_context, max_connections=self._max_connections)

    def pool_in_use(self) -> dict[str, int]:
        """Busy upstream connections by group (provider)."""
        return {} if self._transport is None else self._transport.in_use()

    def retire(self) -> None:
        """A reload replaced this client: idle upstream connections close now, busy ones
        when their response is done (requests in flight finish on it)."""
        if self._transport is not None:
            self._transport.retire()

    async def aclose(self) -> None:
        """Close every connection; later requests fail (``local``: latgate's own state,
        never the upstream's failure)."""
        self._closed = True
        if self._transport is not None:
            self._transport.close()


def upstream_headers(*, auth: dict[str, str], request_id: str, stream: bool) -> dict[str, str]:
    """Headers sent upstream: our own, never the client's (no client key, cookie or
    hop-by-hop header is forwarded). ``identity`` encoding keeps streams uncompressed."""
    headers = {
        "content-type": "application/json",
        "accept": "text/event-stream" if stream else "application/json",
        "accept-encoding": "identity",
        "user-agent": USER_AGENT,
        "x-request-id": request_id,
    }
    headers.update(auth)
    return headers
