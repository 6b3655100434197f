"""Why an upstream could not be had, said to the client, in the access log and a
debug line, and by ``latgate check --probe``: DNS name not found, connection refused,
connection reset, TLS reasons (tests/test_upstream_tls.py), timeouts (connect, no
first byte, between reads); never the URL or key. ``/readyz`` is not ready until the
default route has answered. Upstreams on loopback.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import ssl

import httpx
import pytest
from completions import content
from h1_upstreams import (
    CHAT,
    SECRET,
    SSE_HEAD,
    STREAM,
    RawUpstream,
    chunk,
    config,
    json_reply,
    keep_serving,
    reset,
)
from servers import listening_socket
from stack import gateway

from latgate.commands.check import probe
from latgate.foundation.config import load_config_text
from latgate.transport.errors import connect_failure, failure_cause


def closed_port() -> int:
    sock = listening_socket()
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_each_socket_and_tls_exception_names_its_kind() -> None:
    assert failure_cause(socket.gaierror(socket.EAI_NONAME, "Name or service not known")) == "DNS name not found"
    assert failure_cause(ConnectionRefusedError(111, "refused")) == "connection refused"
    assert failure_cause(ConnectionResetError(104, "reset")) == "connection reset"
    expired = ssl.SSLCertVerificationError(1, "certificate verify failed")
    expired.verify_code = 10
    assert failure_cause(expired) == "TLS: certificate expired"
    assert str(connect_failure(TimeoutError())) == "upstream timed out: connect"
    assert connect_failure(TimeoutError()).kind == "timeout"


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level("DEBUG", logger="latgate")
    return caplog


def test_a_refused_connection_is_named_to_the_client_the_access_log_and_debug(debug_logs) -> None:
    port = closed_port()
    with gateway(config(f"http://127.0.0.1:{port}/v1"), env={"UP_KEY": SECRET}) as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert message == "provider 'up' is unavailable: could not connect to upstream: connection refused"
    access = [json.loads(r.getMessage()) for r in debug_logs.records if r.name == "latgate.access"]
    assert access[-1]["cause"] == "could not connect to upstream: connection refused"
    debug = [r.getMessage() for r in debug_logs.records if r.name == "latgate.upstream"]
    assert any("up-0 failed (connect): could not connect to upstream: connection refused" in line for line in debug)
    for text in [message, *debug, *(r.getMessage() for r in debug_logs.records)]:
        assert str(port) not in text and SECRET not in text


def test_a_name_that_does_not_resolve_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):  # no DNS traffic: this name is made not to exist
        if host == "upstream.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with gateway(config("http://upstream.invalid:8000/v1"), env={"UP_KEY": SECRET}) as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert message == "provider 'up' is unavailable: could not connect to upstream: DNS name not found"
    assert "upstream.invalid" not in message


async def reset_after_request(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await up.request(reader)
    reset(writer)


def silent(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
    async def wait() -> None:
        await up.request(reader)
        await up.released.wait()

    return wait()


async def stalls_mid_body(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await up.request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\":")
    await writer.drain()
    await up.released.wait()


@pytest.mark.parametrize(
    ("handler", "body", "status", "expected"),
    [
        (reset_after_request, CHAT, 502, "upstream closed the connection: connection reset"),
        (silent, CHAT, 504, "upstream timed out: no first byte"),
        # a non-streamed answer must be whole within timeout_sec of sending (docs/configuration.md)
        (stalls_mid_body, CHAT, 504, "no whole answer within timeout_sec (1 s)"),
    ],
    ids=["reset", "first-byte", "between-reads"],
)
def test_each_failure_after_connecting_is_named(handler, body, status, expected) -> None:
    with RawUpstream(handler) as up, gateway(config(up.base_url, timeout=1), env={"UP_KEY": SECRET}) as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=body, timeout=15)
        up.release()
    assert response.status_code == status, response.text
    assert response.json()["error"]["message"].endswith(expected)


def test_a_stream_silent_between_reads_is_named() -> None:
    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        writer.write(SSE_HEAD + chunk(content("a")))
        await writer.drain()
        await up.released.wait()

    with RawUpstream(handler) as up, gateway(config(up.base_url, timeout=1), env={"UP_KEY": SECRET}) as gw:
        with httpx.stream("POST", gw.v1 + "/chat/completions", json=STREAM, timeout=15) as response:
            text = response.read().decode()
        up.release()
    assert response.status_code == 200 and '"a"' in text and "error" in text


def test_check_probe_prints_the_cause_per_endpoint() -> None:
    port = closed_port()
    loaded = load_config_text(config(f"http://127.0.0.1:{port}/v1"), source="t.toml", env={})
    out = io.StringIO()
    assert not probe(loaded, env={}, out=out)
    line = out.getvalue().splitlines()[-1]
    assert line.split()[:2] == ["failed", "up-0"] and "connection refused" in line


def test_readyz_waits_for_the_default_route_to_answer() -> None:
    port = closed_port()
    with gateway(config(f"http://127.0.0.1:{port}/v1"), env={"UP_KEY": SECRET}) as gw:
        ready = httpx.get(gw.url + "/readyz", timeout=15)
    status = ready.json()["status"]
    assert ready.status_code == 503 and status.startswith("default route 'up' has no reachable endpoint: "), status
    assert "connection refused" in status and str(port) not in status and "127.0.0.1" not in status
    with (
        RawUpstream(keep_serving(json_reply(b'{"object":"list","data":[]}'))) as up,
        gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw,
    ):
        ready = httpx.get(gw.url + "/readyz", timeout=15)
        again = httpx.get(gw.url + "/readyz", timeout=15)
    assert ready.status_code == 200 and again.status_code == 200
    assert [r.split(b" ", 2)[:2] for r in up.requests] == [[b"GET", b"/v1/models"]]  # probed once, then known
