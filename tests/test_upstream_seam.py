"""The upstream client's seam: a transport handed to :class:`UpstreamClient` (here respx's
router) carries every request, proxied POSTs and small GETs alike, and what the one
client adds (redirects, decoding, error translation) applies to it as to latgate's own
pool; every transport failure becomes one :class:`UpstreamFailure` kind whose message
names neither URL nor key."""

from __future__ import annotations

import asyncio
import gzip
import socket

import httpx
import pytest
import respx

from latgate.proxy.egress import Egress, Proxy
from latgate.proxy.upstream import UpstreamClient, UpstreamFailure

BASE = "http://up.test:9/v1"
KEY = "sk-secret-123"


def _client(router: respx.Router) -> UpstreamClient:
    return UpstreamClient(
        connect_timeout_seconds=1, read_timeout_seconds=1, transport=httpx.MockTransport(router.async_handler)
    )


async def _post(client: UpstreamClient, path: str = "/chat/completions") -> tuple[int, bytes]:
    response = await client.open(url=BASE + path, payload=b'{"model":"m"}', headers={"authorization": f"Bearer {KEY}"})
    try:
        return response.status_code, await response.aread()
    finally:
        await response.aclose()


def test_a_compressed_answer_reaches_the_forwarder_decoded() -> None:
    def gzipped(request: httpx.Request) -> httpx.Response:  # streamed, as a transport's answer is
        return httpx.Response(200, headers={"content-encoding": "gzip"}, stream=httpx.ByteStream(gzip.compress(b'{"ok":1}')))

    async def run() -> tuple[int, bytes]:
        client = UpstreamClient(connect_timeout_seconds=1, read_timeout_seconds=1, transport=httpx.MockTransport(gzipped))
        try:
            return await _post(client)
        finally:
            await client.aclose()

    assert asyncio.run(run()) == (200, b'{"ok":1}')


def test_a_same_origin_307_is_followed_once_with_its_body_and_another_origin_is_not() -> None:
    router = respx.Router()
    router.post(BASE + "/chat/completions").respond(307, headers={"location": "/v1/moved"})
    moved = router.post(BASE + "/moved").respond(200, json={"ok": 1})
    router.post(BASE + "/away").respond(307, headers={"location": "http://elsewhere.test/v1/moved"})

    async def run() -> tuple[tuple[int, bytes], tuple[int, bytes]]:
        client = _client(router)
        try:
            return await _post(client), await _post(client, "/away")
        finally:
            await client.aclose()

    followed, refused = asyncio.run(run())
    assert followed == (200, b'{"ok":1}')
    assert moved.calls.last.request.content == b'{"model":"m"}'
    assert moved.calls.last.request.headers["authorization"] == f"Bearer {KEY}"
    assert refused[0] == 307 and moved.call_count == 1


def test_gets_go_through_the_same_transport_even_with_a_providers_proxy() -> None:
    router = respx.Router()
    models = router.get(BASE + "/models").respond(200, json={"data": []})
    proxy = Proxy.parse("http://127.0.0.1:9")  # nothing listens there: only the transport answers
    egress = Egress(proxies={"http": proxy}, no_proxy="", ssl_context=None, tls_key=None)

    async def run() -> int:
        client = _client(router)
        try:
            response = await client.get(url=BASE + "/models", headers={}, timeout_seconds=1, egress=egress)
            return response.status_code
        finally:
            await client.aclose()

    assert asyncio.run(run()) == 200 and models.call_count == 1


def _refused() -> httpx.ConnectError:
    error = httpx.ConnectError("All connection attempts failed")
    wrapper = OSError("All connection attempts failed")  # anyio's, around the socket's own error
    wrapper.__cause__ = ConnectionRefusedError(111, "Connection refused")
    error.__cause__ = wrapper
    return error


def _no_descriptor() -> httpx.ConnectError:
    error = httpx.ConnectError("too many open files")
    error.__cause__ = OSError(24, "Too many open files")
    return error


def _dns() -> httpx.ConnectError:
    error = httpx.ConnectError(f"[Errno -2] Name or service not known: {BASE}")
    error.__cause__ = socket.gaierror(-2, "Name or service not known")
    return error


@pytest.mark.parametrize(
    ("raised", "kind", "message"),
    [
        (_refused, "connect", "could not connect to upstream: connection refused"),
        (_dns, "connect", "could not connect to upstream: DNS name not found"),
        (_no_descriptor, "local", "latgate has no free file descriptor or buffer for a new connection"),
        (lambda: httpx.ConnectTimeout(f"connect to {BASE}"), "timeout", "upstream timed out: connect"),
        (lambda: httpx.PoolTimeout("pool"), "timeout", "upstream timed out: connect"),
        (lambda: httpx.ReadTimeout(f"read from {BASE}"), "timeout", "upstream timed out"),
        (lambda: httpx.RemoteProtocolError(f"{BASE} closed"), "read", "upstream connection failed (RemoteProtocolError)"),
        (lambda: httpx.ReadError(KEY), "read", "upstream connection failed (ReadError)"),
    ],
)
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_every_transport_failure_becomes_one_kind_naming_no_url_or_key(raised, kind: str, message: str, method: str) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise raised()

    async def run() -> UpstreamFailure:
        client = UpstreamClient(connect_timeout_seconds=1, read_timeout_seconds=1, transport=httpx.MockTransport(fail))
        try:
            with pytest.raises(UpstreamFailure) as failure:
                if method == "POST":
                    await _post(client)
                else:
                    await client.get(url=BASE + "/models", headers={}, timeout_seconds=1)
            return failure.value
        finally:
            await client.aclose()

    failure = asyncio.run(run())
    assert (failure.kind, str(failure)) == (kind, message)
    assert "up.test" not in str(failure) and KEY not in str(failure)
