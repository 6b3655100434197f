"""Hostile clients, with the client limits of ``[server]`` shortened through config:
idle and slow-head connections, stalled bodies and streams nobody reads are closed
(408 where nothing was sent yet, the upstream closed too, each recorded with its kind);
connections beyond ``max_connections`` get 503 in the OpenAI envelope; a malformed head
gets 400 in it; ``"stream": null`` means not streamed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Iterator

import httpx
import pytest
from apis import APIS, body_for, error_type, post_head, read_answer
from completions import content
from h1_upstreams import (
    SECRET,
    RawUpstream,
    access_errors,
    access_lines,
    chunk,
    json_reply,
    keep_serving,
    requests_with,
)
from h1_upstreams import config as upstream_config
from servers import serve_like_latgate_serve

from latgate.api.serve import Api
from latgate.app.asgi import create_app
from latgate.foundation.config import load_config_text

LIMITS = """
[server]
header_timeout_sec = {head}
body_timeout_sec = {body}
send_timeout_sec = {send}
max_connections = {cap}
"""


@contextlib.contextmanager
def latgate_on(
    up: RawUpstream, *, head: float = 0.5, body: float = 0.5, send: float = 0.5, cap: int = 100
) -> Iterator[int]:
    text = LIMITS.format(head=head, body=body, send=send, cap=cap) + upstream_config(up.base_url)
    config = load_config_text(text, source="t.toml", env={"UP_KEY": SECRET})
    with serve_like_latgate_serve(create_app(config, env={"UP_KEY": SECRET})) as port:
        yield port


def read_until_closed(conn: socket.socket, *, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (fails after ``timeout``)."""
    conn.settimeout(timeout)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := conn.recv(65536):
            received += chunk
    return received


def envelope_of(answer: bytes) -> tuple[bytes, dict]:
    status_line, _, rest = answer.partition(b"\r\n")
    return status_line, json.loads(rest.partition(b"\r\n\r\n")[2])


def head_fields(answer: bytes) -> dict[str, str]:
    head = answer.partition(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
    return {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in head)}


@pytest.fixture
def access_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="latgate.access")
    return caplog


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"])
def test_a_connection_without_a_whole_head_in_time_gets_408_and_is_closed(sent: bytes, access_log) -> None:
    with RawUpstream(keep_serving(json_reply())) as up, latgate_on(up) as port:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(sent)  # idle (nothing at all), or a head that stops halfway (slowloris)
            answer = read_until_closed(conn)
            status_line, body = envelope_of(answer)
        assert status_line == b"HTTP/1.1 408 Request Timeout"
        assert body["error"]["code"] == "request_timeout"
        assert requests_with(port, 408) == 1
        assert (408, "header_timeout") in access_errors(access_log)
        logged = [line["request_id"] for line in access_lines(access_log) if line["error"] == "header_timeout"]
        assert head_fields(answer)["x-request-id"] == logged[0]  # the answer names its access line
        assert up.total == 0


@pytest.mark.parametrize("given", [None, "client-id-7"])
@pytest.mark.parametrize("api", APIS)
def test_a_body_that_stalls_gets_408_and_nothing_goes_upstream(api: Api, given, access_log) -> None:
    extra = b"X-Request-Id: %s\r\n" % given.encode() if given else b""
    with RawUpstream(keep_serving(json_reply())) as up, latgate_on(up) as port:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(post_head(api, content_length=100_000, headers=extra) + b'{"model": "m", "messages": [')
            answer = read_until_closed(conn)
            status_line, body = envelope_of(answer)
        assert status_line == b"HTTP/1.1 408 Request Timeout"
        assert "stalled" in body["error"]["message"]
        error_type(api, body)  # in the API's envelope
        lines = access_lines(access_log)
        assert [(line["path"], line["status"], line["error"]) for line in lines] == [(api.paths[0], 408, "body_timeout")]
        logged = lines[0]["request_id"]
        assert logged not in ("-", "") and (given is None or logged == given)
        assert head_fields(answer)["x-request-id"] == logged  # the answer names the request the log line does
        if api.envelope.schema == "AnthropicError":  # its envelope carries it in the body too
            assert body["request_id"] == logged and head_fields(answer)["request-id"] == logged
        assert requests_with(port, 408) == 1
        assert up.total == 0


async def endless_stream(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Streams 16 KiB content events until the connection breaks."""
    await up.request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    piece = chunk(content("x" * 16384))
    while True:
        writer.write(piece)
        await writer.drain()


def test_a_client_that_never_reads_its_stream_is_cut_and_the_upstream_closed(access_log) -> None:
    request = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    with RawUpstream(endless_stream) as up, latgate_on(up) as port:
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.connect(("127.0.0.1", port))
        with conn:
            conn.sendall(head % len(request) + request)  # and never read
            up.wait_until(lambda: up.total == 1)
            up.wait_until(lambda: up.open == 0, timeout=20)  # latgate closed the upstream
        assert (499, "send_timeout") in access_errors(access_log)
        assert requests_with(port, 499) == 1


def test_connections_beyond_the_cap_get_503_in_the_openai_envelope(access_log) -> None:
    with RawUpstream(keep_serving(json_reply())) as up, latgate_on(up, head=30, cap=2) as port:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            with socket.create_connection(("127.0.0.1", port)) as conn:
                conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
                status_line, body = envelope_of(read_until_closed(conn))
            assert status_line == b"HTTP/1.1 503 Service Unavailable"
            assert body["error"]["code"] == "overloaded"
            assert any("connection limit reached" in r.getMessage() for r in access_log.records)
            assert (503, "connection_limit") in access_errors(access_log)
        finally:
            for conn in held:
                conn.close()
        # below the cap again: served
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            assert client.get("/v1/models").status_code == 200


def test_a_malformed_request_head_gets_400_in_the_openai_envelope(access_log) -> None:
    with (
        RawUpstream(keep_serving(json_reply())) as up,
        latgate_on(up) as port,
        socket.create_connection(("127.0.0.1", port)) as conn,
    ):
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost x\r\n\r\n")
        status_line, body = envelope_of(read_until_closed(conn))
    assert status_line == b"HTTP/1.1 400 Bad Request"
    assert body["error"]["type"] == "invalid_request_error"


def test_stream_null_is_an_answer_not_a_stream() -> None:
    with RawUpstream(keep_serving(json_reply())) as up, latgate_on(up) as port:
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": None},
        )
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"] == "ok"
        assert b'"stream":false' in up.requests[0]


@pytest.mark.parametrize("api", APIS)
def test_a_key_over_its_request_rate_is_refused_before_its_body_is_read(api: Api) -> None:
    auth = '[auth]\n[[auth.keys]]\nname = "small"\nkey = "sk-small"\nrpm = 1\n'
    with RawUpstream(keep_serving(json_reply())) as up:
        text = LIMITS.format(head=5, body=30, send=5, cap=100) + upstream_config(up.base_url) + auth
        config = load_config_text(text, source="t.toml", env={"UP_KEY": SECRET})
        with serve_like_latgate_serve(create_app(config, env={"UP_KEY": SECRET})) as port:
            first = httpx.post(
                f"http://127.0.0.1:{port}{api.paths[0]}", json=body_for(api), headers={"authorization": "Bearer sk-small"}
            )
            assert first.status_code == 200
            key = b"Authorization: Bearer sk-small\r\n"
            with socket.create_connection(("127.0.0.1", port)) as conn:
                # 30 MB announced, a few bytes sent: answered at once, not after the body (or its timeout)
                conn.sendall(post_head(api, content_length=30_000_000, headers=key) + b'{"model": "m", "messages": [')
                status_line, body = read_answer(conn)
            assert status_line.startswith(b"HTTP/1.1 429 ")
            assert error_type(api, body) == "rate_limit_error"
