"""A request declaring a transfer coding latgate does not decode (``Transfer-Encoding:
gzip, chunked``) gets 501 in the envelope of the API at its path, with nothing sent
upstream and the refusal in the access log; ``chunked`` alone is read as before. Raw
sockets against the server ``latgate serve`` runs, a raw upstream behind it."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
from collections.abc import Iterator

import pytest
from apis import RELAYED, body_for, error_type
from h1_upstreams import SECRET, RawUpstream, access_lines, chunk, config, json_reply, keep_serving
from servers import serve_like_latgate_serve

from latgate.api.serve import Api
from latgate.app.asgi import create_app
from latgate.foundation.config import load_config_text


@contextlib.contextmanager
def latgate() -> Iterator[tuple[RawUpstream, int]]:
    with RawUpstream(keep_serving(json_reply())) as up:
        app = create_app(load_config_text(config(up.base_url), source="t.toml", env={"UP_KEY": SECRET}), env={"UP_KEY": SECRET})
        with serve_like_latgate_serve(app) as port:
            yield up, port


def chunked_post(port: int, api: Api, body: bytes, coding: bytes) -> tuple[int, dict]:
    head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nTransfer-Encoding: %s\r\n\r\n" % (
        api.paths[0].encode(), coding
    )
    received = b""
    with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=10)) as conn:
        conn.sendall(head + chunk(body) + b"0\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            while piece := conn.recv(65536):
                received += piece
    status_line, _, rest = received.partition(b"\r\n")
    return int(status_line.split(b" ")[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize("api", RELAYED)
@pytest.mark.parametrize("compressed", [False, True], ids=["plain-body", "gzip-body"])
def test_gzip_chunked_is_501_in_the_route_s_envelope_and_nothing_goes_upstream(api: Api, compressed: bool, caplog) -> None:
    caplog.set_level("INFO", logger="latgate.access")
    body = json.dumps(body_for(api)).encode()
    with latgate() as (up, port):
        status, answer = chunked_post(port, api, gzip.compress(body) if compressed else body, b"gzip, chunked")
        assert up.requests == []
    assert status == 501, answer
    assert error_type(api, answer) in ("invalid_request_error", "api_error")  # the route's envelope
    assert "transfer coding 'gzip'" in answer["error"]["message"]
    assert access_lines(caplog)[-1]["status"] == 501


def test_chunked_alone_is_read_and_relayed() -> None:
    (api,) = [param.values[0] for param in RELAYED if param.values[0].name == "/chat/completions"]
    with latgate() as (up, port):
        status, answer = chunked_post(port, api, json.dumps(body_for(api)).encode(), b"chunked")
    assert status == 200 and answer["object"] == "chat.completion"
    assert len(up.requests) == 1
