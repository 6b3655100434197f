"""The one pooled upstream client, and the one place foreign errors become ours.

Proxied requests (the POSTs of the hot path) go through latgate's own HTTP/1.1 pool
(:mod:`latgate.proxy.h1`: asyncio protocols and httptools); :meth:`UpstreamClient.open`
returns an :class:`~latgate.proxy.h1.H1Response`, the slice of ``httpx.Response`` the
forwarder reads. Each provider's proxy and TLS settings (:mod:`latgate.proxy.egress`),
a same-origin 307/308 and a compressed answer (:mod:`latgate.proxy.decoding`) are
handled here, for every proxied request. Everything else (health probes, engine load
and catalog reads, ``latgate check --probe``) is a small GET (:meth:`UpstreamClient.get`)
on the same pool, with the same proxy and TLS settings.

The seam tests swap: an ``httpx.AsyncBaseTransport`` passed to :class:`UpstreamClient`
(``httpx.MockTransport``, respx's) then carries every request, POSTs and GETs, as an
``httpx.Response``.

Every exception of httpx or asyncio raised while talking to an upstream is translated
into :class:`UpstreamFailure` by :func:`upstream_errors`, with a ``kind`` used as the
``latgate_upstream_errors_total`` label. Its message never contains the upstream URL or
key (httpx messages can carry the URL: they are dropped).
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from latgate import __version__
from latgate.proxy.decoding import MAX_DECODED_BYTES, DecodedResponse, decoder_problem
from latgate.proxy.egress import Egress
from latgate.proxy.errors import (
    LOCAL_ERRNOS,
    LOCAL_SHORTAGE,
    UpstreamFailure,
    client_certificate_alert,
    failure_cause,
)
from latgate.proxy.h1 import H1Pool, H1Response
from latgate.proxy.prelude import KeepalivePrelude

__all__ = ["UpstreamClient", "UpstreamFailure", "read_at_most", "upstream_errors", "upstream_headers"]

USER_AGENT = f"latgate/{__version__}"
#: Redirects that keep the method and body (RFC 9110 sections 15.4.8 and 15.4.9): one is
#: followed when it stays on the same origin. Others (301, 302, 303) are not answers.
SAME_ORIGIN_REDIRECTS = frozenset({307, 308})


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


def _port(parts: Any) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


@contextlib.contextmanager
def upstream_errors() -> Iterator[None]:
    """Translate transport exceptions into :class:`UpstreamFailure` (the only place).
    latgate's own shortage of descriptors or buffers is kind ``local``, never the
    upstream's failure."""
    try:
        yield
    except (httpx.ConnectTimeout, httpx.PoolTimeout):
        raise UpstreamFailure("timeout", "upstream timed out: connect") from None
    except (TimeoutError, httpx.TimeoutException):
        raise UpstreamFailure("timeout", "upstream timed out") from None
    except (httpx.HTTPError, OSError) as exc:
        root = _root_cause(exc)
        if isinstance(root, OSError) and root.errno in LOCAL_ERRNOS:
            raise UpstreamFailure("local", LOCAL_SHORTAGE) from None
        alert = client_certificate_alert(root)
        if alert is not None:  # TLS 1.3: refused after the handshake, on the first read
            raise UpstreamFailure("connect", f"could not connect to upstream: {alert}") from None
        if isinstance(exc, httpx.ConnectError):
            detail = f": {failure_cause(root)}" if root is not None else ""
            raise UpstreamFailure("connect", f"could not connect to upstream{detail}") from None
        raise UpstreamFailure("read", f"upstream connection failed ({type(exc).__name__})") from None
    except ValueError:  # the client library refused the request itself (e.g. a key with a newline)
        raise UpstreamFailure("request", "the request could not be sent (check the provider's key and URL)") from None


def _root_cause(exc: BaseException) -> OSError | None:
    """The socket or TLS error under an httpx exception chain, if any: the first with an
    errno (or a TLS error) when a plain one wraps it (anyio's "all connection attempts
    failed")."""
    seen = 0
    found: OSError | None = None
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, OSError) and not isinstance(current, TimeoutError):
            if current.errno is not None or isinstance(current, ssl.SSLError):
                return current
            found = found or current
        current = current.__cause__ or current.__context__
        seen += 1
    return found


async def read_at_most(
    response: object,
    limit: int,
    *,
    prelude: KeepalivePrelude | None = None,
) -> bytes:
    """The whole body of ``response`` (an upstream response: ``headers``,
    ``aiter_raw()``), at most ``limit`` bytes. ``prelude``: keep-alives before the body's
    first real byte are skipped (not kept, not counted).

    Raises:
        UpstreamFailure: ``too_large`` as soon as the declared (``content-length``) or
            received size passes ``limit`` (what was read is dropped); others as the
            body's reads raise them.
    """
    declared = response.headers.get("content-length")  # type: ignore[attr-defined]
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise UpstreamFailure("too_large", f"its answer of {int(declared)} bytes exceeds max_response_bytes ({limit})")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():  # type: ignore[attr-defined]
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
    """One pooled HTTP client per process for every provider.

    Args:
        connect_timeout_seconds: TCP/TLS connect (and pool wait) limit.
        read_timeout_seconds: the longest silence allowed between two reads.
        transport: carries every request instead of latgate's pool and httpx's
            default transport (tests: ``httpx.MockTransport``, respx).
        max_connections: connections per provider on latgate's pool when a request gives
            no limit of its own (and of the GET client, over every upstream).
        verify: TLS verification for https upstreams (on by default).
    """

    def __init__(
        self,
        *,
        connect_timeout_seconds: float,
        read_timeout_seconds: float,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 1000,
        verify: bool = True,
    ) -> None:
        self._transport = transport
        self._h1: H1Pool | None = None
        self._connect_timeout = connect_timeout_seconds
        self._read_timeout = read_timeout_seconds
        self._max_connections = max_connections
        # Made here, not at the first request: loading the CA bundle takes tens of ms,
        # which would count against the first upstream's measured latency.
        self._ssl_context = httpx.create_ssl_context(verify=verify, trust_env=False) if transport is None else None
        self._timeout = httpx.Timeout(
            connect=connect_timeout_seconds,
            read=read_timeout_seconds,
            write=read_timeout_seconds,
            pool=connect_timeout_seconds,
        )
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.AsyncClient(
            transport=transport, verify=self._ssl_context or True, limits=limits, timeout=self._timeout, trust_env=False
        )
        self._urls: dict[str, httpx.URL] = {}
        self._timeouts: dict[float | None, dict[str, float | None]] = {}

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
    ) -> H1Response | DecodedResponse | httpx.Response:
        """POST ``payload`` (JSON bytes) to ``url`` and return once the status and headers
        arrived; the body is left to stream (``aiter_raw``; the caller must ``aclose``).
        ``egress``: the provider's proxy and TLS settings (``None``: direct with the
        default TLS context). The connection is one of ``group``'s (a provider's), at
        most ``max_connections`` of them (see :class:`~latgate.proxy.h1.H1Pool`). A
        compressed body decodes to at most ``max_decoded_bytes``.

        Returns:
            an :class:`~latgate.proxy.h1.H1Response` (a
            :class:`~latgate.proxy.decoding.DecodedResponse` over it for a compressed
            body), or the injected transport's ``httpx.Response`` (all:
            ``status_code``, ``headers``, ``aiter_raw()``, ``aread()``, ``aclose()``).

        Raises:
            UpstreamFailure: no response could be had.
        """
        slot = (group, max_connections)
        pool = self._h1
        if pool is not None:  # the hot path, inlined: latgate's own pool, already open
            response: Any = await pool.post(
                url=url, payload=payload, headers=headers,
                read_timeout_seconds=self._read_timeout if read_timeout_seconds is None else read_timeout_seconds,
                egress=egress, group=group, max_connections=max_connections,
            )  # fmt: skip
        else:
            response = await self._send(url, payload, headers, read_timeout_seconds, egress, slot)
        if response.status_code in SAME_ORIGIN_REDIRECTS or "content-encoding" in response.headers:
            return await self._unusual(response, url, payload, headers, read_timeout_seconds, egress, slot, max_decoded_bytes)
        return response

    async def _unusual(
        self,
        response: Any,
        url: str,
        payload: bytes,
        headers: dict[str, str],
        read_timeout_seconds: float | None,
        egress: Egress | None,
        slot: tuple[str, int | None],
        max_decoded_bytes: int = MAX_DECODED_BYTES,
    ) -> Any:
        """A same-origin 307/308 followed once (method and body kept, RFC 9110 section
        15.4.8/15.4.9), unless it names ``url`` itself (a loop: returned as it is, for
        the caller to report); a compressed body decoded (:mod:`latgate.proxy.decoding`)."""
        if response.status_code in SAME_ORIGIN_REDIRECTS:
            location = same_origin_location(url, response.headers.get("location"))
            if location is not None and location != url:
                if isinstance(response, H1Response):  # the follow-up goes on a new connection
                    response.close_connection()
                else:
                    await response.aclose()
                response = await self._send(location, payload, headers, read_timeout_seconds, egress, slot)
                response.followed = location  # a redirect from here is a second one (failures.redirect_refused)
        encoding = response.headers.get("content-encoding")
        if encoding is None:
            return response
        problem = decoder_problem(encoding)
        if problem is not None:
            await response.aclose()
            raise UpstreamFailure("read", problem)
        return DecodedResponse(response, encoding, max_decoded_bytes=max_decoded_bytes)

    async def _send(
        self,
        url: str,
        payload: bytes,
        headers: dict[str, str],
        read_timeout_seconds: float | None,
        egress: Egress | None,
        slot: tuple[str, int | None] = ("", None),
    ) -> Any:
        """One request; ``slot``: the pool group (provider) and its connection limit."""
        if self._transport is not None:
            return await self._open_transport(url=url, payload=payload, headers=headers, read_timeout_seconds=read_timeout_seconds)
        pool = self._pool()
        return await pool.post(
            url=url, payload=payload, headers=headers,
            read_timeout_seconds=self._read_timeout if read_timeout_seconds is None else read_timeout_seconds,
            egress=egress, group=slot[0], max_connections=slot[1],
        )  # fmt: skip

    async def _open_transport(
        self, *, url: str, payload: bytes, headers: dict[str, str], read_timeout_seconds: float | None
    ) -> httpx.Response:
        """The POST on the injected transport (straight to it: no redirect, auth or
        cookie handling of ``AsyncClient.send``)."""
        assert self._transport is not None
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx.URL(url)
        timeout = self._timeouts.get(read_timeout_seconds)
        if timeout is None:
            base = self._timeout if read_timeout_seconds is None else self._timeout_with_read(read_timeout_seconds)
            timeout = self._timeouts[read_timeout_seconds] = base.as_dict()
        request = httpx.Request("POST", parsed, content=payload, headers=headers, extensions={"timeout": timeout})
        with upstream_errors():
            return await self._transport.handle_async_request(request)

    async def get(
        self, *, url: str, headers: dict[str, str], timeout_seconds: float, egress: Egress | None = None
    ) -> httpx.Response:
        """A small GET (health probes, engine metrics and catalogs, ``check --probe``),
        body read (uncompressed: ``accept-encoding: identity``), on latgate's own pool
        (the injected transport's client in tests), its connections shared by every
        upstream (no provider's connection limit is taken), through the proxy and with
        the TLS settings of ``egress`` (the provider's) as proxied requests are.

        Why not httpx: a GET through httpx's client cost ~0.3 ms of CPU on a kept
        connection and ~0.8 ms on a new one; with hundreds of idle endpoints probed
        that was a share of every proxied request (docs/performance.md).

        Raises:
            UpstreamFailure: no response could be had.
        """
        if self._transport is not None:
            with upstream_errors():
                return await self._client.get(url, headers=headers, timeout=timeout_seconds)
        pool = self._pool()
        sent = {"accept-encoding": "identity", "user-agent": USER_AGENT, **headers}
        response = await pool.post(
            url=url, payload=b"", headers=sent, read_timeout_seconds=timeout_seconds, egress=egress, method="GET"
        )
        try:
            body = await response.aread()
        finally:
            await response.aclose()
        return httpx.Response(response.status_code, headers=response.headers, content=body)

    def _pool(self) -> H1Pool:
        """latgate's own pool, opened at the first request (it needs the running loop)."""
        if self._h1 is None:
            self._h1 = H1Pool(
                connect_timeout_seconds=self._connect_timeout, ssl_context=self._ssl_context, max_connections=self._max_connections
            )
        return self._h1

    def _timeout_with_read(self, read_seconds: float) -> httpx.Timeout:
        return httpx.Timeout(
            connect=self._timeout.connect, read=read_seconds, write=read_seconds, pool=self._timeout.pool
        )

    def pool_in_use(self) -> dict[str, int]:
        """Busy upstream connections by group (provider), on latgate's own pool."""
        return {} if self._h1 is None else self._h1.in_use()

    def retire(self) -> None:
        """A reload replaced this client: idle upstream connections close now, busy ones
        when their response is done (requests in flight finish on it)."""
        if self._h1 is not None:
            self._h1.retire()

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._h1 is not None:
            self._h1.close()


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
