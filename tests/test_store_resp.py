"""The store's Redis client against a fake Redis on loopback: a hostile reply is a
protocol error (RespError, connection dropped), never an exception escaping into
asyncio's transport."""

from __future__ import annotations

import asyncio
import logging

import pytest

from latgate.live.store.resp import RespClient, RespError, RespTimeout

NESTED_5000 = b"*1\r\n" * 5000


async def read_command(reader: asyncio.StreamReader) -> list[bytes]:
    """One command as clients send it: an array of bulk strings."""
    count = int((await reader.readuntil(b"\r\n"))[1:-2])
    args = []
    for _ in range(count):
        size = int((await reader.readuntil(b"\r\n"))[1:-2])
        args.append((await reader.readexactly(size + 2))[:-2])
    return args


async def fake_redis(
    first_reply: bytes, *, first_connection_answers: int | None = None
) -> tuple[asyncio.Server, list[asyncio.Event]]:
    """A server answering the first connection's first command with ``first_reply``
    and every later command with ``+PONG`` (on the first connection, only its first
    ``first_connection_answers`` commands: then it reads and never answers, as a hung
    Redis); each connection's event is set at its EOF."""
    closed: list[asyncio.Event] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        eof = asyncio.Event()
        first = not closed
        answers = first_connection_answers if first else None
        closed.append(eof)
        try:
            while True:
                await read_command(reader)
                if answers is not None:
                    if answers == 0:
                        continue
                    answers -= 1
                writer.write(first_reply if first else b"+PONG\r\n")
                first = False
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            eof.set()
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, closed


@pytest.mark.parametrize("reply", [NESTED_5000, b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"])
def test_a_reply_nested_too_deep_is_a_protocol_error_that_drops_the_connection(reply, caplog) -> None:
    async def scenario() -> None:
        server, closed = await fake_redis(reply)
        port = server.sockets[0].getsockname()[1]
        client = RespClient(f"redis://127.0.0.1:{port}/0", timeout_seconds=5)
        async with server:
            with pytest.raises(RespError, match="lost"):
                await asyncio.wait_for(client.call(b"PING"), 5)
            await asyncio.wait_for(closed[0].wait(), 5)  # latgate hung up
            assert await asyncio.wait_for(client.call(b"PING"), 5) == "PONG"  # a fresh connection
            await client.aclose()

    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        asyncio.run(scenario())
    assert "Fatal error" not in caplog.text and "RecursionError" not in caplog.text


def test_the_nesting_the_store_uses_is_read() -> None:
    async def scenario() -> list:
        server, _ = await fake_redis(b"*2\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n")
        port = server.sockets[0].getsockname()[1]
        client = RespClient(f"redis://127.0.0.1:{port}/0", timeout_seconds=5)
        async with server:
            value = await asyncio.wait_for(client.call(b"PING"), 5)
            await client.aclose()
        return value

    assert asyncio.run(scenario()) == [1, [b"a", None]]


def test_a_hung_server_fails_every_waiting_call_at_the_timeout_and_the_next_call_reconnects() -> None:
    async def scenario() -> list:
        server, closed = await fake_redis(b"+PONG\r\n", first_connection_answers=1)
        port = server.sockets[0].getsockname()[1]
        client = RespClient(f"redis://127.0.0.1:{port}/0", timeout_seconds=0.2)
        async with server:
            assert await asyncio.wait_for(client.call(b"PING"), 5) == "PONG"  # connected; then it hangs
            calls = [client.call(b"PING") for _ in range(3)]
            # bounded by the client's own timeout (0.2 s), well inside wait_for's 5 s
            failures = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
            await asyncio.wait_for(closed[0].wait(), 5)  # latgate hung up on it
            assert await asyncio.wait_for(client.call(b"PING"), 5) == "PONG"  # a fresh connection
            await client.aclose()
        return failures

    failures = asyncio.run(scenario())
    assert [type(f) for f in failures] == [RespTimeout] * 3
