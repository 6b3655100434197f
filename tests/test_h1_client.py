"""latgate's own HTTP/1.1 upstream pool (latgate.transport.h1) against raw asyncio servers on
loopback: what goes on the wire, body framings, keep-alive, failures and their kinds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Self

import pytest

from latgate.transport import h1
from latgate.transport.errors import UpstreamFailure
from latgate.transport.h1 import H1Pool

Handler = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Server:
    """A loopback TCP server; ``handler(server, reader, writer, connection_number)`` per
    connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.request_seen = asyncio.Event()

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(self, reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        self.request_seen.set()
        return request


def json_response(body: bytes = b'{"ok":1}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


def pool(**overrides: float) -> H1Pool:
    return H1Pool(
        connect_timeout_seconds=overrides.get("connect", 2.0),
        ssl_context=None,
        max_connections=int(overrides.get("max", 100)),
    )


async def post(
    p: H1Pool, url: str, *, headers: dict[str, str] | None = None, read_timeout: float = 5.0
) -> bytes:
    response = await p.post(
        url=url, payload=b'{"model":"m"}', headers=headers or {}, read_timeout_seconds=read_timeout
    )
    try:
        return await response.aread()
    finally:
        await response.aclose()


def test_the_request_goes_out_whole_and_the_connection_is_kept_for_the_next_one() -> None:
    async def handler(server, reader, writer, n):
        while True:
            await server.read_request(reader)
            writer.write(json_response(b'{"n":%d}' % len(server.requests)))

    async def scenario() -> None:
        async with Server(handler) as server:
            p = pool()
            first = await post(p, server.url, headers={"authorization": "Bearer k", "x-request-id": "r1"})
            second = await post(p, server.url)
            p.close()
        assert (first, second) == (b'{"n":1}', b'{"n":2}')
        assert server.connections == 1
        head, _, body = server.requests[0].partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
        assert b"host: 127.0.0.1:%d" % int(server.url.split(":")[2].split("/")[0]) in lines
        assert (
            b"content-length: 13" in lines
            and b"authorization: Bearer k" in lines
            and b"x-request-id: r1" in lines
        )
        assert body == b'{"model":"m"}'

    asyncio.run(scenario())


def test_a_chunked_body_arrives_dechunked_and_headers_read_in_any_case() -> None:
    async def handler(server, reader, writer, n):
        await server.read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-A: 1\r\nx-a: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for piece in (b"data: 1\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    async def scenario() -> None:
        async with Server(handler) as server:
            p = pool()
            response = await p.post(url=server.url, payload=b"{}", headers={}, read_timeout_seconds=5)
            assert response.status_code == 200
            assert (
                response.headers.get("CONTENT-TYPE") == "text/event-stream"
                and response.headers["x-a"] == "1, 2"
            )
            body = b"".join([chunk async for chunk in response.aiter_raw()])
            await response.aclose()
            p.close()
        assert body == b"data: 1\n\ndata: [DONE]\n\n"

    asyncio.run(scenario())


def test_a_body_without_length_ends_with_the_connection() -> None:
    async def handler(server, reader, writer, n):
        await server.read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{"a":')
        await writer.drain()
        writer.write(b"1}")

    async def scenario() -> None:
        async with Server(handler) as server:
            p = pool()
            assert await post(p, server.url) == b'{"a":1}'
            assert await post(p, server.url) == b'{"a":1}'  # not reused: a second connection
            p.close()
        assert server.connections == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(
            b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"cut', id="body_shorter_than_its_length"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab", id="chunked_cut"),
        pytest.param(b"SMTP ready\r\n\r\n", id="not_http"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc", id="two_lengths"
        ),
        pytest.param(b"", id="closed_before_any_byte"),
    ],
)
def test_a_broken_response_is_a_read_failure(reply: bytes) -> None:
    async def handler(server, reader, writer, n):
        await server.read_request(reader)
        writer.write(reply)

    async def scenario() -> None:
        async with Server(handler) as server:
            p = pool()
            with pytest.raises(UpstreamFailure) as failure:
                await post(p, server.url)
            p.close()
        assert failure.value.kind == "read"
        assert "127.0.0.1" not in str(failure.value)

    asyncio.run(scenario())


async def drops_the_second_request_on_its_first_connection(server: Server, reader, writer, n) -> None:
    await server.read_request(reader)
    if n == 1:
        writer.write(json_response(b'{"n":1}'))  # keep-alive advertised ...
        await server.read_request(reader)  # ... but the next request on it is dropped
        return
    writer.write(json_response(b'{"n":%d}' % n))


def test_a_connection_dropped_after_idling_is_retried_once_on_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Idle for RETRY_IDLE_SECONDS or more: the upstream most likely closed it as idle."""
    monkeypatch.setattr(h1, "RETRY_IDLE_SECONDS", 0.0)

    async def scenario() -> None:
        async with Server(drops_the_second_request_on_its_first_connection) as server:
            p = pool()
            assert await post(p, server.url) == b'{"n":1}'
            assert await post(p, server.url) == b'{"n":2}'
            p.close()
        assert server.connections == 2 and len(server.requests) == 3

    asyncio.run(scenario())


def test_a_busy_connection_dropped_after_reading_the_request_is_not_sent_again() -> None:
    """Reused at once, then closed after the request was read: the upstream may have
    been working on it, so sending it again could generate twice."""

    async def scenario() -> None:
        async with Server(drops_the_second_request_on_its_first_connection) as server:
            p = pool()
            assert await post(p, server.url) == b'{"n":1}'
            with pytest.raises(UpstreamFailure) as failure:
                await post(p, server.url)
            p.close()
        assert failure.value.kind == "read"
        assert server.connections == 1 and len(server.requests) == 2

    asyncio.run(scenario())


def test_silence_past_the_read_timeout_fails_without_a_retry() -> None:
    stall = asyncio.Event()

    async def handler(server, reader, writer, n):
        await server.read_request(reader)
        if n == 2:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await stall.wait()

    async def scenario() -> None:
        async with Server(handler) as server:
            p = pool()
            with pytest.raises(UpstreamFailure) as no_headers:
                await p.post(url=server.url, payload=b"{}", headers={}, read_timeout_seconds=0.05)
            response = await p.post(url=server.url, payload=b"{}", headers={}, read_timeout_seconds=0.05)
            with pytest.raises(UpstreamFailure) as no_body:
                await anext(response.aiter_raw())
            await response.aclose()
            stall.set()
            p.close()
        assert no_headers.value.kind == "timeout" and no_body.value.kind == "timeout"
        assert server.connections == 2 and len(server.requests) == 2

    asyncio.run(scenario())


def test_a_header_holding_a_newline_is_refused_before_anything_is_sent() -> None:
    async def handler(server, reader, writer, n):
        await server.read_request(reader)

    async def scenario() -> None:
        async with Server(handler) as server:
            p = pool()
            for bad in (
                {"authorization": "Bearer k\r\nx-evil: 1"},
                {"authorization": "Bearer k\n"},
                {"x\0": "1"},
            ):
                with pytest.raises(UpstreamFailure) as failure:
                    await post(p, server.url, headers=bad)
                assert failure.value.kind == "request" and "Bearer" not in str(failure.value)
            p.close()
        assert server.connections == 0

    asyncio.run(scenario())


def test_userinfo_in_the_url_is_sent_as_basic_auth_and_never_in_the_target() -> None:
    async def handler(server, reader, writer, n):
        await server.read_request(reader)
        writer.write(json_response())

    async def scenario() -> None:
        async with Server(handler) as server:
            p = pool()
            await post(p, server.url.replace("http://", "http://us%40er:p%3Aw@"))
            p.close()
        head = server.requests[0].split(b"\r\n\r\n")[0]
        assert b"authorization: Basic dXNAZXI6cDp3" in head.split(b"\r\n")  # us@er:p:w
        assert b"p%3Aw" not in head and head.startswith(b"POST /v1/chat/completions HTTP/1.1")

    asyncio.run(scenario())


def test_requests_over_the_connection_limit_wait_for_a_free_slot() -> None:
    release = asyncio.Event()

    async def handler(server, reader, writer, n):
        while True:
            await server.read_request(reader)
            if len(server.requests) == 1:
                await release.wait()
            writer.write(json_response(b'{"n":%d}' % len(server.requests)))

    async def scenario() -> None:
        async with Server(handler) as server:
            p = pool(max=1)
            first = asyncio.create_task(post(p, server.url))
            second = asyncio.create_task(post(p, server.url))
            await asyncio.wait_for(server.request_seen.wait(), 5)
            assert not second.done() and server.connections == 1
            release.set()
            assert await first == b'{"n":1}' and await second == b'{"n":2}'
            p.close()
        assert server.connections == 1

    asyncio.run(scenario())


def test_a_cancelled_request_closes_its_connection() -> None:
    closed = asyncio.Event()

    async def handler(server, reader, writer, n):
        await server.read_request(reader)
        if await reader.read(1) == b"":
            closed.set()

    async def scenario() -> None:
        async with Server(handler) as server:
            p = pool()
            task = asyncio.create_task(post(p, server.url))
            await asyncio.wait_for(server.request_seen.wait(), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(closed.wait(), 5)
            p.close()

    asyncio.run(scenario())


def test_a_refused_connection_is_a_connect_failure() -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        p = pool()
        with pytest.raises(UpstreamFailure) as failure:
            await post(p, f"http://127.0.0.1:{port}/v1/chat/completions")
        assert failure.value.kind == "connect" and str(port) not in str(failure.value)
        p.close()

    asyncio.run(scenario())
