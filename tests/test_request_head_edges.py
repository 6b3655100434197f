"""Odd request heads and bodies get answers that say what is wrong, in few words: an
HTTP/0.9-style request line (no version) gets 505, an ``Expect`` other than
``100-continue`` 417, a routing header's bad value is shown as UTF-8 text, escaped and
cut short, and a body that is not UTF-8 is named so without the parser's jargon. Raw
sockets and httpx against the server ``latgate serve`` runs."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from h1_upstreams import SECRET, RawUpstream, config, json_reply, keep_serving
from servers import serve_like_latgate_serve

from latgate.app.asgi import create_app
from latgate.foundation.config import load_config_text
from latgate.routing.headers import SHOWN_VALUE_CHARS


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with RawUpstream(keep_serving(json_reply())) as up:
        app = create_app(load_config_text(config(up.base_url), source="t.toml", env={"UP_KEY": SECRET}), env={"UP_KEY": SECRET})
        with serve_like_latgate_serve(app) as port:
            yield port


def raw(port: int, request: bytes) -> tuple[int, bytes]:
    received = b""
    with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=10)) as conn:
        conn.sendall(request)
        with contextlib.suppress(ConnectionResetError):
            while piece := conn.recv(65536):
                received += piece
    status_line, _, rest = received.partition(b"\r\n")
    return int(status_line.split(b" ")[1]), rest.partition(b"\r\n\r\n")[2]


def test_an_http09_request_line_is_505(port: int) -> None:
    status, body = raw(port, b"GET /healthz\r\n\r\n")
    assert status == 505 and "HTTP/0.9" in json.loads(body)["error"]["message"]


def test_an_expectation_other_than_100_continue_is_417(port: int) -> None:
    status, body = raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n")
    assert status == 417 and "200-ok" in json.loads(body)["error"]["message"]
    status, _ = raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
    assert status == 200


def test_a_bad_header_value_is_shown_as_utf8_escaped_and_cut_short(port: int) -> None:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    wide = httpx.post(url, json=chat, headers={"X-Latency-Budget-Ms": "０".encode()}, timeout=10)
    assert wide.status_code == 400 and "not '０'" in wide.json()["error"]["message"], wide.text
    long = httpx.post(url, json=chat, headers={"X-Latency-Budget-Ms": "9" * 400}, timeout=10)
    message = long.json()["error"]["message"]
    assert long.status_code == 400 and "9" * (SHOWN_VALUE_CHARS + 1) not in message and "(400 characters)" in message
    control = httpx.post(url, json=chat, headers={"X-Latency-Sensitive": b"ja\tnein"}, timeout=10)
    assert control.status_code == 400 and "'ja\\tnein'" in control.json()["error"]["message"], control.text


def test_a_body_that_is_not_utf8_is_named_so(port: int) -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"\xff"}]}'
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=10)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "request body is not valid UTF-8: send JSON text encoded as UTF-8"


def test_a_bad_latency_sensitive_value_is_told_every_value_accepted(port: int) -> None:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    bad = httpx.post(url, json=chat, headers={"X-Latency-Sensitive": "maybe"}, timeout=10)
    message = bad.json()["error"]["message"]
    assert bad.status_code == 400 and message.endswith(", not 'maybe'"), bad.text
    listed = message.removeprefix("X-Latency-Sensitive must be ").removesuffix(", not 'maybe'").replace(" or ", ", ").split(", ")
    assert {"on", "off", "1", "0"} <= set(listed)  # docs/routing.md names on/off too
    for value in listed:  # each value the message names is one the gateway takes
        assert httpx.post(url, json=chat, headers={"X-Latency-Sensitive": value}, timeout=10).status_code == 200, value
