"""latgate's HTTP/1.1 upstream pool (latgate.transport.h1) driven directly against hostile and
buggy upstreams: interim responses, bytes after a complete response, framings that end
a connection, resets, full socket buffers, huge headers, odd URLs and the pool's limit.

End-to-end counterparts: ``test_h1_faults_e2e.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
from h1_upstreams import (
    OK_SMALL,
    answering,
    fetch,
    json_reply,
    new_pool,
    read_request,
    reset,
    serving,
)

from latgate.transport import h1conn
from latgate.transport.errors import UpstreamFailure


def failure_fetching(reply: bytes) -> UpstreamFailure:
    """What fetching from an upstream that answers ``reply`` raises (it must raise)."""

    async def scenario() -> UpstreamFailure:
        async with serving(answering(reply)) as (url, _):
            pool = new_pool()
            try:
                with pytest.raises(UpstreamFailure) as failure:
                    await fetch(pool, url)
            finally:
                pool.close()
        return failure.value

    return asyncio.run(scenario())


def test_an_interim_100_continue_is_skipped_for_the_final_response() -> None:
    async def scenario() -> None:
        async with serving(
            answering(b"HTTP/1.1 100 Continue\r\n\r\n|" + OK_SMALL, pause_after_first_write=True)
        ) as (url, _):
            pool = new_pool()
            assert await fetch(pool, url) == (
                200,
                {"content-type": "application/json", "content-length": "8"},
                b'{"ok":1}',
            )
            pool.close()

    asyncio.run(scenario())


def test_headers_of_a_103_early_hints_do_not_join_the_final_response() -> None:
    async def scenario() -> None:
        async with serving(
            answering(b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n" + OK_SMALL)
        ) as (url, _):
            pool = new_pool()
            status, headers, body = await fetch(pool, url)
            pool.close()
        assert (status, body) == (200, b'{"ok":1}')
        assert "link" not in headers

    asyncio.run(scenario())


def test_junk_after_a_complete_response_neither_fails_it_nor_is_reused() -> None:
    async def scenario() -> None:
        async with serving(answering(OK_SMALL + b"junk-after-the-body", OK_SMALL)) as (url, state):
            pool = new_pool()
            first = await fetch(pool, url)
            second = await fetch(pool, url)
            pool.close()
        assert first[2] == b'{"ok":1}' and second[2] == b'{"ok":1}'
        assert state["connections"] == 2  # the connection that carried junk is not reused

    asyncio.run(scenario())


def test_a_second_response_after_the_declared_length_never_joins_the_first() -> None:
    smuggled = OK_SMALL + b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-evil: 1\r\n\r\nEVIL!"

    async def scenario() -> None:
        async with serving(answering(smuggled, OK_SMALL)) as (url, state):
            pool = new_pool()
            status, headers, body = await fetch(pool, url)
            second = await fetch(pool, url)
            pool.close()
        assert (status, body) == (200, b'{"ok":1}') and headers == {
            "content-type": "application/json",
            "content-length": "8",
        }
        assert second[2] == b'{"ok":1}' and state["connections"] == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(
            b'HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 8\r\n\r\n{"ok":1}',
            id="connection_close_with_length",
        ),
        pytest.param(b'HTTP/1.0 200 OK\r\ncontent-length: 8\r\n\r\n{"ok":1}', id="http10_with_length"),
        pytest.param(b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello", id="204_with_a_body"),
        pytest.param(b"HTTP/1.1 304 Not Modified\r\n\r\nhello", id="304_with_a_body"),
    ],
)
def test_a_response_that_cannot_be_followed_on_its_connection_is_not_reused(reply: bytes) -> None:
    async def scenario() -> None:
        async with serving(answering(reply, OK_SMALL)) as (url, state):
            pool = new_pool()
            first = await pool.post(url=url, payload=b"{}", headers={}, read_timeout_seconds=5)
            with contextlib.suppress(UpstreamFailure):
                await first.aread()
            await first.aclose()
            assert await fetch(pool, url) == (
                200,
                {"content-type": "application/json", "content-length": "8"},
                b'{"ok":1}',
            )
            pool.close()
        assert state["connections"] == 2

    asyncio.run(scenario())


def test_both_content_length_and_chunked_is_refused() -> None:
    async def scenario() -> None:
        reply = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        async with serving(answering(reply)) as (url, _):
            pool = new_pool()
            with pytest.raises(UpstreamFailure) as failure:
                await fetch(pool, url)
            assert pool.open_connections() == 0
            pool.close()
        assert failure.value.kind == "read"

    asyncio.run(scenario())


@pytest.mark.parametrize("when", ["before_headers", "mid_body"])
def test_a_reset_connection_is_a_read_failure_and_frees_its_slot(when: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if when == "mid_body":
            writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"cut')
            await writer.drain()
        reset(writer)

    async def scenario() -> None:
        async with serving(handler) as (url, _):
            pool = new_pool()
            with pytest.raises(UpstreamFailure) as failure:
                await fetch(pool, url)
            assert pool.open_connections() == 0
            pool.close()
        assert failure.value.kind == "read" and "127.0.0.1" not in str(failure.value)

    asyncio.run(scenario())


def test_an_upstream_that_never_reads_a_10mb_payload_times_out_and_frees_its_slot() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.Event().wait()  # full socket buffers: never reads the body

    async def scenario() -> None:
        async with serving(handler) as (url, _state):
            pool = new_pool()
            with pytest.raises(UpstreamFailure) as failure:
                await fetch(pool, url, payload=b"x" * 10_000_000, read_timeout=0.3)
            assert pool.open_connections() == 0
            pool.close()
        assert failure.value.kind == "timeout"

    asyncio.run(scenario())


def test_a_413_sent_before_the_payload_was_read_reaches_the_caller() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\ncontent-length: 9\r\n\r\ntoo large"
        )
        await writer.drain()
        writer.write_eof()
        while await reader.read(65536):  # a lingering close, as nginx and uvicorn do
            pass

    async def scenario() -> None:
        async with serving(handler) as (url, _):
            pool = new_pool()
            status, _, body = await fetch(pool, url, payload=b"x" * 10_000_000)
            pool.close()
        assert (status, body) == (413, b"too large")

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(b"x-big: " + b"v" * 4_000_000 + b"\r\n", id="one_4mb_header"),
        pytest.param(b"x-a: v\r\n" * 200_000, id="200k_headers"),
    ],
)
def test_response_headers_beyond_a_sane_size_are_refused(headers: bytes) -> None:
    failure = failure_fetching(b"HTTP/1.1 200 OK\r\n" + headers + b"content-length: 2\r\n\r\nok")
    assert failure.kind == "read"


def test_a_complete_response_left_unread_does_not_poison_its_connection() -> None:
    body = b"x" * (h1conn.HIGH_WATER_BYTES + 1)  # the read that crosses the high-water mark ends the body

    async def scenario() -> None:
        async with serving(
            answering(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        ) as (url, _):
            pool = new_pool()
            response = await pool.post(url=url, payload=b"{}", headers={}, read_timeout_seconds=1.0)
            conn = response._conn
            deadline = time.monotonic() + 5
            while not conn.complete and time.monotonic() < deadline:  # let it all arrive, unread
                await asyncio.sleep(0.001)
            await response.aclose()  # e.g. the client left, or the hedge lost
            status, _, again = await fetch(pool, url, read_timeout=1.0)
            pool.close()
        assert (status, len(again)) == (200, len(body))

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("path", "request_line"),
    [
        pytest.param(
            "/modèles/v1/chat/completions",
            b"POST /mod%C3%A8les/v1/chat/completions HTTP/1.1",
            id="non_ascii_path_percent_encoded",
        ),
        pytest.param(
            "/v1/a%2Fb/chat?api-version=2024-10-01&x=%20y",
            b"POST /v1/a%2Fb/chat?api-version=2024-10-01&x=%20y HTTP/1.1",
            id="query_and_escapes_as_written",
        ),
    ],
)
def test_the_request_target_is_the_urls_path_and_query_percent_encoded(
    path: str, request_line: bytes
) -> None:
    requests: list[bytes] = []

    async def scenario() -> None:
        async with serving(answering(OK_SMALL, record=requests), path=path) as (url, _):
            pool = new_pool()
            await fetch(pool, url)
            pool.close()
        assert requests[0].startswith(request_line + b"\r\n")

    asyncio.run(scenario())


def test_an_ipv6_literal_upstream_gets_a_bracketed_host_header_and_keep_alive() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    requests: list[bytes] = []

    async def scenario() -> None:
        try:
            context = serving(answering(OK_SMALL, record=requests), host="::1")
            url, state = await context.__aenter__()
        except OSError:
            pytest.skip("no IPv6 loopback")
        try:
            pool = new_pool()
            assert (await fetch(pool, url))[2] == b'{"ok":1}'
            assert (await fetch(pool, url))[2] == b'{"ok":1}'
            pool.close()
        finally:
            await context.__aexit__(None, None, None)
        port = url.split("]:")[1].split("/")[0]
        assert b"\r\nhost: [::1]:%s\r\n" % port.encode() in requests[0]
        assert state["connections"] == 1

    asyncio.run(scenario())


def test_latin1_header_values_arrive_decoded_as_latin1() -> None:
    async def scenario() -> None:
        async with serving(answering(json_reply(b'{"ok":1}', extra=b"x-name: caf\xe9 \xff\r\n"))) as (url, _):
            pool = new_pool()
            _, headers, _ = await fetch(pool, url)
            pool.close()
        assert headers["x-name"] == "café ÿ"

    asyncio.run(scenario())


def test_the_connection_limit_holds_when_an_idle_connection_was_closed_by_the_upstream() -> None:
    async def scenario() -> None:
        hold = asyncio.Event()
        peak = 0

        async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal peak
            peak = max(peak, state["open"])
            await read_request(reader)
            await hold.wait()
            writer.write(OK_SMALL)
            await writer.drain()

        async def answers_once_then_closes(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            await read_request(reader)
            writer.write(OK_SMALL)  # keep-alive advertised, then the upstream closes it idle
            await writer.drain()

        async with serving(held) as (url, state), serving(answers_once_then_closes) as (other_url, _):
            pool = new_pool(max_connections=2)
            await fetch(pool, other_url)
            deadline = time.monotonic() + 5
            while pool.open_connections() and time.monotonic() < deadline:  # until the upstream's close arrived
                await asyncio.sleep(0.001)
            tasks = [asyncio.create_task(fetch(pool, url)) for _ in range(3)]
            while state["connections"] < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            for _ in range(20):  # let a third connection be attempted, if it is going to be
                await asyncio.sleep(0)
            hold.set()
            await asyncio.gather(*tasks)
            pool.close()
        assert peak <= 2

    asyncio.run(scenario())


def test_a_101_switching_protocols_is_a_read_failure_without_a_logged_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failure = failure_fetching(
        b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n\x00\x00\x12"
    )
    assert failure.kind == "read"
    # (the test server's own cancelled handler task may log at shutdown: not latgate's)
    assert not [r for r in caplog.records if r.name == "asyncio" and "Fatal error" in r.getMessage()]
