"""A client that leaves while latgate waits for the upstream: its attempt is cancelled
(the upstream connection closed), no retry or fallback is sent for it, and the
request is recorded as 499, for small bodies and for large ones (parsed off the loop)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from h1_upstreams import SECRET, RawUpstream, config, json_reply
from servers import serve_like_latgate_serve

from latgate.app.asgi import create_app
from latgate.forwarding import largebody
from latgate.foundation.config import load_config_text

UNAVAILABLE = json_reply(
    b'{"error":{"message":"overloaded","type":"server_error"}}', status=b"503 Service Unavailable"
)


async def fail_slowly(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Every attempt: wait for the gateway to give up (it closes the connection) or for
    the read timeout to pass, then answer a retryable 503."""
    await up.request(reader)
    await reader.read(1)  # b"" once the gateway closed the connection
    writer.write(UNAVAILABLE)
    await writer.drain()


def request_bytes(body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )


def metric(port: int, code: int) -> float:
    """``latgate_requests_total`` of ``code``, over its other labels."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("latgate_requests_total{") and f'code="{code}"' in line
    )


@contextlib.contextmanager
def failing_gateway() -> Iterator[tuple[RawUpstream, int]]:
    """An upstream failing every attempt slowly behind a gateway served as ``latgate
    serve`` does, with a 1 s read timeout: the first attempt times out and is retried
    (without the cancel, so would the one a client left in be). Yields (upstream, port)."""
    text = config("{base}", retries=3, ftt=1, timeout=1)
    with RawUpstream(fail_slowly) as up:
        env = {"UP_KEY": SECRET}
        app = create_app(load_config_text(text.format(base=up.base_url), source="t.toml", env=env), env=env)
        with serve_like_latgate_serve(app) as port:
            yield up, port


@pytest.mark.parametrize("leaves_in", [1, 2], ids=["first attempt", "retry"])
@pytest.mark.parametrize("messages", [1, 60_000], ids=["small body", "large body"])
def test_a_client_leaving_during_a_failing_attempt_gets_no_retry_and_a_499(
    messages: int, leaves_in: int
) -> None:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": f"m {i}"} for i in range(messages)]}
    ).encode()
    with failing_gateway() as (up, port):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(request_bytes(body))
            up.wait_until(lambda: len(up.requests) == leaves_in)
        # the client is gone: the upstream's connection closes, nothing else comes
        up.wait_until(lambda: up.open == 0 or len(up.requests) > leaves_in)
        deadline = time.monotonic() + 10
        while metric(port, 499) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert metric(port, 499) == 1
        assert len(up.requests) == leaves_in, "an attempt was sent for a client that had gone"
        assert metric(port, 503) == 0 and metric(port, 504) == 0


@pytest.mark.parametrize("leaves_in", [1, 2], ids=["first attempt", "retry"])
def test_a_large_body_is_freed_when_its_client_leaves_without_the_cyclic_collector(
    leaves_in: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Freed by reference counting as the request ends, failed attempts included, not
    held until the cyclic collector runs."""
    freed = threading.Event()
    monkeypatch.setattr(largebody, "_TRIM", lambda pad: freed.set())
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": f"m {i}"} for i in range(60_000)]}
    ).encode()
    with failing_gateway() as (up, port):
        gc.disable()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                client.sendall(request_bytes(body))
                up.wait_until(lambda: len(up.requests) == leaves_in)
            assert freed.wait(10), "the body outlived its request"
        finally:
            gc.enable()
        assert metric(port, 499) == 1
