"""The one pooled upstream HTTP client, and the one place foreign errors become ours.

latgate keeps httpx as its client API but not httpx's default transport: measured on
this project's machines, a proxied request costs ~2.1 ms of CPU through httpx's
default (httpcore) transport and ~0.4 ms through aiohttp, and ~53 µs vs ~9 µs per
streamed chunk. So the client runs on the ``httpx-aiohttp`` transport (aiohttp's
connection pool and parser under the httpx ``AsyncClient`` interface); tests can pass
any other ``httpx.AsyncBaseTransport`` (e.g. respx's) to :class:`UpstreamClient`.

Every exception of httpx, aiohttp or asyncio raised while talking to an upstream is
translated into :class:`UpstreamFailure` by :func:`upstream_errors`, with a ``kind``
used as the ``latgate_upstream_errors_total`` label. Its message never contains the
upstream URL or key (httpx messages can carry the URL: they are dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

import aiohttp
import httpx

from latgate import __version__

USER_AGENT = f"latgate/{__version__}"


class UpstreamFailure(Exception):
    """Talking to an upstream failed without an HTTP status to show for it.

    Attributes:
        kind: ``connect`` (refused, reset, DNS, TLS before any response), ``timeout``
            (connect, read or first-token deadline), ``read`` (the connection broke or
            the response was malformed after it started).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@contextlib.contextmanager
def upstream_errors() -> Iterator[None]:
    """Translate transport exceptions into :class:`UpstreamFailure` (the only place)."""
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout, aiohttp.ClientConnectorError) as exc:
        # httpx-aiohttp maps every aiohttp.ClientConnectionError (including a server
        # disconnecting mid-body) to ConnectTimeout; look at the cause to tell them apart.
        cause = exc.__cause__
        if isinstance(cause, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
            raise UpstreamFailure("read", "upstream closed the connection") from None
        if isinstance(cause, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
            raise UpstreamFailure("timeout", "upstream timed out") from None
        raise UpstreamFailure("connect", "could not connect to upstream") from None
    except (TimeoutError, httpx.TimeoutException, aiohttp.ServerTimeoutError):
        raise UpstreamFailure("timeout", "upstream timed out") from None
    except (httpx.HTTPError, aiohttp.ClientError, OSError) as exc:
        raise UpstreamFailure("read", f"upstream connection failed ({type(exc).__name__})") from None
    except ValueError:  # the client library refused the request itself (e.g. a key with a newline)
        raise UpstreamFailure("request", "the request could not be sent (check the provider's key and URL)") from None


class UpstreamClient:
    """One pooled HTTP client per process for every provider.

    Args:
        connect_timeout_seconds: TCP/TLS connect (and pool wait) limit.
        read_timeout_seconds: the longest silence allowed between two reads.
        transport: replaces the aiohttp transport (tests).
        max_connections: pool size across all upstreams.
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
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        if transport is None:
            transport = default_transport(limits=limits, verify=verify)
        self._timeout = httpx.Timeout(
            connect=connect_timeout_seconds,
            read=read_timeout_seconds,
            write=read_timeout_seconds,
            pool=connect_timeout_seconds,
        )
        self._transport = transport
        self._client = httpx.AsyncClient(transport=transport, timeout=self._timeout, trust_env=False)
        self._urls: dict[str, httpx.URL] = {}
        self._timeouts: dict[float | None, dict[str, float | None]] = {}

    async def open(
        self,
        *,
        url: str,
        payload: bytes,
        headers: dict[str, str],
        read_timeout_seconds: float | None = None,
    ) -> httpx.Response:
        """POST ``payload`` (JSON bytes) to ``url`` and return once the status and headers
        arrived; the body is left to stream (``aiter_raw``; the caller must ``aclose``).

        Raises:
            UpstreamFailure: no response could be had.
        """
        # The hot path goes to the transport directly: AsyncClient.send adds redirect,
        # auth and cookie handling latgate never wants (~25% of a proxied request's CPU
        # in a profile), and URL parsing is cached per upstream URL.
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

    async def get(self, *, url: str, headers: dict[str, str], timeout_seconds: float) -> httpx.Response:
        """A small GET (health probes, engine metrics), body read.

        Raises:
            UpstreamFailure: no response could be had.
        """
        with upstream_errors():
            return await self._client.get(url, headers=headers, timeout=timeout_seconds)

    def _timeout_with_read(self, read_seconds: float) -> httpx.Timeout:
        return httpx.Timeout(
            connect=self._timeout.connect, read=read_seconds, write=read_seconds, pool=self._timeout.pool
        )

    async def aclose(self) -> None:
        await self._client.aclose()


#: ``LATGATE_UPSTREAM_TRANSPORT=httpx`` selects httpx's own transport instead (for
#: ``benchmarks/overhead.py``, which compares the two in one run).
TRANSPORT_ENV_VAR = "LATGATE_UPSTREAM_TRANSPORT"


def default_transport(*, limits: httpx.Limits, verify: bool) -> httpx.AsyncBaseTransport:
    """The aiohttp transport, or httpx's default one when the environment asks for it."""
    if os.environ.get(TRANSPORT_ENV_VAR) == "httpx":
        return httpx.AsyncHTTPTransport(limits=limits, verify=verify, trust_env=False)
    from httpx_aiohttp import AiohttpTransport

    return AiohttpTransport(limits=limits, verify=verify, trust_env=False)


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
