"""Kept connections the upstream closed, and upstream redirects, on the wire: a kept
connection reset by the upstream before any byte of the answer (it closed it with the
request unread) is retried once on a new connection; a same-host 307 whose connection the upstream closes
without ``connection: close`` is followed on a fresh connection (the kept connection
found closed is the usual stale keep-alive, never the upstream's failure), and a
redirect to another host tells the client only its status and that it was
cross-origin (its path, which may hold a tenant id or a token, is in the log only).
Through a real gateway and raw upstreams on loopback."""

from __future__ import annotations

import asyncio

import httpx
from h1_upstreams import (
    CHAT,
    OK_JSON,
    OK_SMALL,
    SECRET,
    RawUpstream,
    assert_clean_logs,
    config,
    fetch,
    gauge_total,
    json_reply,
    keep_serving,
    new_pool,
    read_request,
    reset,
    serving,
)
from stack import gateway


def request_path(request: bytes) -> str:
    return request.split(b" ", 2)[1].decode()


async def redirect_then_close(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The first connection: a 307 to /v2/... kept open by its headers, then closed;
    every later one answers every request."""
    if up.total == 1:
        await up.request(reader)
        writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /v2/chat/completions\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()
        return
    await keep_serving(json_reply())(up, reader, writer)


def test_a_same_host_307_on_a_connection_then_closed_is_followed_on_a_fresh_one(caplog) -> None:
    with RawUpstream(redirect_then_close) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
        errors = gauge_total(gw.v1, "latgate_upstream_errors_total")
    assert response.status_code == 200 and response.content == OK_JSON, response.text
    assert [request_path(r) for r in up.requests] == ["/v1/chat/completions", "/v2/chat/completions"]
    assert up.total == 2  # the follow-up went out on a new connection
    assert errors == 0  # the closed kept connection is not the upstream's failure
    assert_clean_logs(caplog)


def test_a_kept_connection_reset_before_any_answer_byte_is_retried_on_a_new_one() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK_SMALL)  # keep-alive advertised ...
        await writer.drain()
        if live["served"]["connections"] == 1:
            await reader.read(1)  # ... but the next request's first bytes are thrown away
            reset(writer)
            return
        while True:
            await read_request(reader)
            writer.write(OK_SMALL)
            await writer.drain()

    async def scenario() -> None:
        async with serving(handler) as (url, served):
            live["served"] = served
            pool = new_pool()
            assert (await fetch(pool, url))[2] == b'{"ok":1}'
            assert (await fetch(pool, url))[2] == b'{"ok":1}'
            pool.close()
            assert served["connections"] == 2

    live: dict = {}
    asyncio.run(scenario())
