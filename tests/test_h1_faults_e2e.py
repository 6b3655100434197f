"""latgate's HTTP/1.1 upstream pool (latgate.transport.h1) end to end: hostile and buggy
upstreams behind a gateway (interim responses, odd statuses, bytes past the body,
keys in headers, IPv6), 200 streams with clients leaving, a slow client, hung
upstreams past the first-token deadline, reloads with streams in flight. Every test
also checks the logs for tracebacks, the key and upstream addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from completions import DONE, content
from h1_upstreams import (
    CHAT,
    OK_JSON,
    SECRET,
    SSE_HEAD,
    STREAM,
    RawUpstream,
    assert_clean_logs,
    chunk,
    config,
    in_flight,
    json_reply,
    keep_serving,
    pool_in_use,
    stack_on,
)
from stack import gateway, gateway_file

from latgate.transport import h1, h1conn


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Callable[[], None]:
    """Call it at the end of a test: :func:`assert_clean_logs` over what was logged."""
    caplog.set_level(logging.INFO)
    return lambda: assert_clean_logs(caplog)


async def interim_then_final(
    up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    while True:
        request = await up.request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # pacing: the gateway parses the 100 on its own
        if b'"stream":true' in request:
            writer.write(SSE_HEAD + chunk(content("ok")) + chunk(DONE) + b"0\r\n\r\n")
        else:
            writer.write(json_reply())
        await writer.drain()


@pytest.mark.parametrize("body", [CHAT, STREAM], ids=["json", "stream"])
def test_an_upstream_100_continue_before_its_200_is_answered_normally(
    body: dict, logs: Callable[[], None]
) -> None:
    with stack_on(interim_then_final) as (_, v1, _app):
        try:
            response = httpx.post(v1 + "/chat/completions", json=body, timeout=15)
        except httpx.RemoteProtocolError as exc:
            pytest.fail(f"the gateway dropped the connection: {exc}")
    assert response.status_code == 200 and b'"ok"' in response.content
    logs()


@pytest.mark.parametrize(
    "reply", [b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 304 Not Modified\r\n\r\n"], ids=["204", "304"]
)
def test_an_upstream_204_or_304_is_a_clean_bad_gateway(reply: bytes, logs: Callable[[], None]) -> None:
    with stack_on(keep_serving(reply)) as (_, v1, _app):
        try:
            response = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
        except httpx.RemoteProtocolError as exc:
            pytest.fail(f"the gateway dropped the connection: {exc}")
    assert response.status_code == 502 and response.json()["error"]["type"] == "api_error"
    logs()


def test_junk_after_a_complete_json_answer_still_answers_once(logs: Callable[[], None]) -> None:
    with stack_on(keep_serving(json_reply() + b"junk"), retries=1) as (up, v1, _app):
        response = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
        assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "ok"
        assert len(up.requests) == 1
    logs()


def test_a_stray_crlf_after_a_complete_json_answer_is_harmless(logs: Callable[[], None]) -> None:
    with stack_on(keep_serving(json_reply() + b"\r\n"), retries=1) as (up, v1, _app):
        first = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
        second = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
        assert (first.status_code, second.status_code) == (200, 200) and len(up.requests) == 2
    logs()


def test_a_client_never_sees_bytes_past_the_declared_length(logs: Callable[[], None]) -> None:
    smuggled = json_reply() + b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nEVIL!"
    with stack_on(keep_serving(smuggled)) as (_, v1, _app):
        response = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
    assert response.status_code == 200 and response.content == OK_JSON
    logs()


@pytest.mark.parametrize("body", [CHAT, STREAM], ids=["json", "stream"])
def test_the_key_echoed_in_the_upstream_content_type_never_reaches_the_client(
    body: dict, logs: Callable[[], None]
) -> None:
    if body.get("stream"):
        reply = (
            SSE_HEAD.replace(b"text/event-stream", b"text/event-stream; debug=" + SECRET.encode())
            + chunk(content("ok"))
            + chunk(DONE)
            + b"0\r\n\r\n"
        )
    else:
        reply = json_reply().replace(b"application/json", b"application/json; debug=" + SECRET.encode())
    with stack_on(keep_serving(reply)) as (_, v1, _app):
        response = httpx.post(v1 + "/chat/completions", json=body, timeout=15)
    assert response.status_code == 200
    assert SECRET not in str(response.headers) and SECRET.encode() not in response.content
    logs()


def test_upstream_headers_echoing_the_key_or_its_address_are_not_relayed(logs: Callable[[], None]) -> None:
    echo = (
        b"x-echo-authorization: Bearer %s\r\nx-upstream: http://127.0.0.1:1/v1\r\nset-cookie: s=%s\r\nx-latin: caf\xe9\r\n"
        % (SECRET.encode(), SECRET.encode())
    )
    error = b'{"error":{"message":"bad key %s at http://10.9.9.9:8000/v1"}}' % SECRET.encode()
    replies = [json_reply(extra=echo), json_reply(error, status=b"500 Internal Server Error", extra=echo)]
    with stack_on(keep_serving(lambda n: replies[min(n - 1, 1)])) as (_, v1, _app):
        ok = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
        failed = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
    assert ok.status_code == 200 and failed.status_code == 500
    for response in (ok, failed):
        shown = str(response.headers) + response.text
        assert (
            SECRET not in shown
            and "10.9.9.9" not in shown
            and "127.0.0.1:1" not in shown
            and "Traceback" not in shown
        )
    logs()


def test_an_ipv6_literal_upstream_works_through_the_gateway(logs: Callable[[], None]) -> None:
    try:
        up = RawUpstream(keep_serving(json_reply()), host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    with up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        assert httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15).status_code == 200
        assert httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15).status_code == 200
        assert up.total == 1 and b"\r\nhost: [::1]:%d\r\n" % up.port in up.requests[0]
    logs()


def gated_stream(
    up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Awaitable[None]:
    """Per request: the first content event, then (once ``released``) the rest; returns
    when the gateway closes the connection instead."""

    async def run() -> None:
        while True:
            await up.request(reader)
            writer.write(SSE_HEAD + chunk(content("first")))
            await writer.drain()
            eof = asyncio.ensure_future(reader.read(1))
            released = asyncio.ensure_future(up.released.wait())
            await asyncio.wait({eof, released}, return_when=asyncio.FIRST_COMPLETED)
            if eof.done():
                released.cancel()
                return  # the gateway closed the connection mid-stream
            eof.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await eof
            writer.write(chunk(content("second")) + chunk(DONE) + b"0\r\n\r\n")
            await writer.drain()

    return run()


async def open_stream(client: httpx.AsyncClient, url: str) -> httpx.Response:
    response = await client.send(client.build_request("POST", url, json=STREAM), stream=True)
    assert response.status_code == 200
    return response


def test_200_streams_with_half_the_clients_leaving_leak_no_connection_and_no_in_flight_count(
    monkeypatch: pytest.MonkeyPatch, logs: Callable[[], None]
) -> None:
    streams = 200

    async def clients(url: str) -> list[bytes]:
        limits = httpx.Limits(max_connections=streams + 10, max_keepalive_connections=streams + 10)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            responses = await asyncio.gather(*(open_stream(client, url) for _ in range(streams)))
            pieces = [r.aiter_raw() for r in responses]
            firsts = [await anext(p) for p in pieces]
            assert all(b'"first"' in first for first in firsts)
            for response in responses[::2]:
                await response.aclose()  # the client leaves mid-stream
            await asyncio.to_thread(up.wait_until, lambda: up.open == streams // 2)
            up.release()
            return [
                first + b"".join([piece async for piece in p])
                for p, first in zip(pieces[1::2], firsts[1::2], strict=True)
            ]

    with stack_on(gated_stream) as (up, v1, _):
        bodies = asyncio.run(clients(v1 + "/chat/completions"))
        assert all(body.endswith(DONE) and b'"second"' in body for body in bodies)
        deadline = time.monotonic() + 10
        while in_flight(v1) and time.monotonic() < deadline:  # the relay finishes after its last byte
            time.sleep(0.01)
        assert in_flight(v1) == 0
        assert up.total == streams and up.open == streams // 2  # the finished ones, kept alive
        # idle past the keep-alive limit: the next request closes them all and opens one
        monkeypatch.setattr(h1, "KEEPALIVE_SECONDS", 0.05)
        time.sleep(0.1)
        with httpx.stream("POST", v1 + "/chat/completions", json=STREAM, timeout=15) as response:
            assert response.read().endswith(DONE)
        up.wait_until(lambda: up.open == 1)
        assert up.total == streams + 1
    logs()


def test_a_slow_client_is_not_failed_by_the_upstream_read_timeout(logs: Callable[[], None]) -> None:
    """timeout_sec is the upstream's silence; a client that stops reading for 3x that long,
    while the upstream writes as fast as it can until every buffer on the way is full
    (so the gateway stops reading it), must not see its stream ended."""
    resumed = threading.Event()
    state = {"events": 0, "blocked": False}

    async def firehose(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        writer.write(SSE_HEAD + chunk(content("first")))
        while not resumed.is_set():
            writer.write(chunk(content("x" * 1000)))
            state["events"] += 1
            state["blocked"] = True
            await writer.drain()
            state["blocked"] = False
        writer.write(chunk(DONE) + b"0\r\n\r\n")
        await writer.drain()

    with (
        stack_on(firehose, timeout=0.5) as (_, v1, _app),
        httpx.stream("POST", v1 + "/chat/completions", json=STREAM, timeout=30) as response,
    ):
        pieces = response.iter_raw()
        received = next(pieces)
        time.sleep(1.5)  # the behaviour under test: a client that stops reading
        assert state["blocked"], "the upstream was never held back"
        resumed.set()
        received += b"".join(pieces)
    assert received.endswith(DONE) and b'"error"' not in received[-2000:]
    assert received.count(b"data: ") == state["events"] + 2
    logs()


@pytest.mark.parametrize("stall", ["before_headers", "after_headers"])
def test_a_hung_upstream_past_the_first_token_deadline_gets_its_connection_closed(
    stall: str, logs: Callable[[], None]
) -> None:
    async def hung(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        if stall == "after_headers":
            writer.write(SSE_HEAD)
            await writer.drain()
        await reader.read(1)  # nothing more until the gateway gives up

    with stack_on(hung, ftt=0.3, timeout=30) as (up, v1, _):
        started = time.monotonic()
        response = httpx.post(v1 + "/chat/completions", json=STREAM, timeout=15)
        assert response.status_code == 504 and time.monotonic() - started < 10
        up.wait_until(lambda: up.open == 0)
        assert up.total == 1
        assert "127.0.0.1" not in response.text and SECRET not in response.text
    logs()


def reload_config(base: str, *, timeout: float) -> str:
    return config(base, timeout=timeout) + '[routing]\ndefault_route = "up"\n'


@pytest.mark.parametrize("timeout_change", [False, True], ids=["same_pool", "new_pool"])
def test_streams_in_flight_finish_across_a_reload(
    tmp_path, timeout_change: bool, logs: Callable[[], None]
) -> None:
    async def clients(url: str, admin: str) -> tuple[int, list[bytes]]:
        async with httpx.AsyncClient(timeout=30) as client:
            responses = await asyncio.gather(*(open_stream(client, url) for _ in range(5)))
            pieces = [r.aiter_raw() for r in responses]
            firsts = [await anext(p) for p in pieces]
            reloaded = await client.post(admin)
            up.release()
            return reloaded.status_code, [
                first + b"".join([piece async for piece in p])
                for p, first in zip(pieces, firsts, strict=True)
            ]

    with RawUpstream(gated_stream) as up:
        path = tmp_path / "config.toml"
        path.write_text(reload_config(up.base_url, timeout=10))
        with gateway_file(path, env={"UP_KEY": SECRET}) as stack:
            url = stack.url
            path.write_text(reload_config(up.base_url, timeout=11 if timeout_change else 10))
            status, bodies = asyncio.run(clients(url + "/v1/chat/completions", url + "/admin/reload"))
            assert status == 200
            assert all(body.endswith(DONE) and b'"second"' in body for body in bodies)
            after = httpx.post(url + "/v1/chat/completions", json=STREAM, timeout=15)
            assert after.status_code == 200 and after.content.endswith(DONE)
            assert up.total == (
                6 if timeout_change else 5
            )  # the new pool opened one, or the old one was reused
    logs()


def test_a_retired_pool_lets_go_of_its_idle_connections(tmp_path) -> None:
    with RawUpstream(keep_serving(json_reply())) as up:
        path = tmp_path / "config.toml"
        path.write_text(reload_config(up.base_url, timeout=10))
        with gateway_file(path, env={"UP_KEY": SECRET}) as stack:
            url = stack.url
            assert httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=15).status_code == 200
            for timeout in (11, 12, 13):
                path.write_text(reload_config(up.base_url, timeout=timeout))
                assert httpx.post(url + "/admin/reload").status_code == 200
                assert httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=15).status_code == 200
            assert up.total == 4
            up.wait_until(lambda: up.open == 1, timeout=2)


async def terminator_on_release(
    up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A stream whose chunked terminator comes a moment after [DONE] (uvicorn writes the
    end of the body with its own write): here, once the client has read [DONE]."""
    while True:
        await up.request(reader)
        writer.write(SSE_HEAD + chunk(content("ok")) + chunk(DONE))
        await writer.drain()
        await up.released.wait()
        up.released.clear()
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def test_a_stream_whose_terminator_lags_its_done_keeps_its_connection(
    logs: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The terminator is sent once the client has read [DONE], through two threads: give
    # the drain ample time so the outcome never depends on how busy the machine is.
    monkeypatch.setattr(h1conn, "DRAIN_SECONDS", 10.0)
    with stack_on(terminator_on_release) as (up, v1, _):
        for _ in range(3):
            with httpx.stream("POST", v1 + "/chat/completions", json=STREAM, timeout=15) as response:
                received = b""
                for piece in response.iter_raw():
                    received += piece
                    if received.endswith(DONE):
                        up.release()
            assert received.endswith(DONE)
            # A request arriving while the last one still drains opens a connection of its
            # own (as with any pool): wait until the drained connection is back.
            deadline = time.monotonic() + 10
            while pool_in_use(v1) and time.monotonic() < deadline:
                time.sleep(0.005)
        assert up.total == 1, f"{up.total} upstream connections for 3 streams"
    logs()
