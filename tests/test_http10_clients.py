"""HTTP/1.0 clients (``curl -0``, old proxies) on the server ``latgate serve`` runs
(uvicorn's httptools protocol with latgate's limits): a stream on every streaming route
comes close-delimited with ``connection: close`` and no chunked framing (HTTP/1.0 has
no chunked coding, RFC 9112 section 6.1), so the SSE bytes are the events themselves; a
non-streamed answer keeps its Content-Length; HTTP/1.1 streams stay chunked. Raw
sockets against a gateway in front of a simulator on loopback."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import pytest
from apis import STREAMED, body_for
from servers import serve_like_latgate_serve
from stack import default_route_config, simulator_urls

from latgate.api.serve import Api
from latgate.app.asgi import create_app
from latgate.foundation.config import load_config_text


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with simulator_urls(["up"]) as urls:
        config = load_config_text(default_route_config(urls, default="up"), source="t.toml", env={})
        with serve_like_latgate_serve(create_app(config, env={})) as port:
            yield port


def exchange(port: int, api: Api, body: dict, *, version: bytes) -> tuple[dict[str, str], bytes]:
    """POST ``body`` to ``api`` over HTTP/``version``; the answer's header fields (lower
    case) and its body bytes as sent, read until the server closes the connection."""
    payload = json.dumps(body).encode()
    head = b"POST %s HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
        api.paths[0].encode(), version, len(payload)
    )
    if version == b"1.1":
        head += b"Connection: close\r\n"
    received = b""
    with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=10)) as conn:
        conn.sendall(head + b"\r\n" + payload)
        while piece := conn.recv(65536):
            received += piece
    raw_head, _, raw_body = received.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    assert lines[0].split(" ")[1] == "200", received[:500]
    fields = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return fields, raw_body


def events_of(body: bytes) -> list[bytes]:
    return [event for event in body.replace(b"\r\n", b"\n").split(b"\n\n") if event.strip()]


@pytest.mark.parametrize("api", STREAMED)
def test_an_http10_stream_is_close_delimited_not_chunked(port: int, api: Api) -> None:
    fields, body = exchange(port, api, body_for(api, stream=True), version=b"1.0")
    assert "transfer-encoding" not in fields and "content-length" not in fields, fields
    assert fields["connection"] == "close"
    events = events_of(body)
    assert events, body
    for event in events:  # every line an SSE field: no chunk size in between
        for line in event.split(b"\n"):
            assert line.startswith((b"data:", b"event:", b":", b"id:")), event
    assert b"[DONE]" in events[-1] or b"completed" in events[-1] or b"message_stop" in events[-1], events[-1]


@pytest.mark.parametrize("api", STREAMED)
def test_an_http10_answer_keeps_its_content_length_and_http11_streams_stay_chunked(port: int, api: Api) -> None:
    fields, body = exchange(port, api, body_for(api), version=b"1.0")
    assert int(fields["content-length"]) == len(body) and json.loads(body)
    fields, _ = exchange(port, api, body_for(api, stream=True), version=b"1.1")
    assert fields["transfer-encoding"] == "chunked"
