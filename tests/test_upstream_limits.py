"""latgate's own upstream limits: a provider's connection pool (``max_connections``),
the largest SSE event (``max_event_bytes``) and non-streamed body
(``max_response_bytes``). Past a limit the request fails clearly (503 ``overloaded``,
502, or an error event mid-stream), without a retry and without counting against the
upstream's health."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
from completions import content
from h1_upstreams import SECRET, RawUpstream, chunk
from stack import gateway, requests_total

STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def limits_config(base: str, *, provider: str = "", defaults: str = "") -> str:
    return (
        f"[defaults]\ntimeout_sec = 10\nconnect_timeout_sec = 0.3\nmax_retries = 2\n{defaults}\n"
        f'[providers.up]\napi_base = "{base}"\napi_key_env = "UP_KEY"\n{provider}\n'
        "[health]\nprobe_interval_sec = 0\nfailure_threshold = 1\n"
    )


@contextlib.contextmanager
def latgate(up: RawUpstream, **sections: str) -> Iterator[str]:
    with gateway(limits_config(up.base_url, **sections), env={"UP_KEY": SECRET}) as gw:
        yield gw.url


async def held_stream(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A stream's first token, then nothing until the test releases the upstream."""
    await up.request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    writer.write(chunk(content("one")))
    await writer.drain()
    await up.released.wait()
    writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


def metric(url: str, name: str) -> float:
    lines = httpx.get(url + "/metrics").text.splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith(name + "{") and 'provider="up"' in line
    )


def endpoint_state(url: str) -> dict:
    return httpx.get(url + "/admin/providers").json()["providers"]["up"]["endpoints"][0]


def test_a_full_pool_is_503_overloaded_without_retry_or_health_mark() -> None:
    with (
        RawUpstream(held_stream) as up,
        latgate(up, provider="max_connections = 2") as url,
        httpx.Client(base_url=url + "/v1", timeout=10) as client,
    ):
        streams = [client.stream("POST", "/chat/completions", json=STREAM) for _ in range(2)]
        lines = []  # kept: a dropped line iterator closes its response
        try:
            for stream in streams:
                response = stream.__enter__()
                assert response.status_code == 200
                lines.append(response.iter_lines())
                next(lines[-1])  # the first token: the stream holds its connection
            assert metric(url, "latgate_upstream_pool_in_use") == 2
            refused = client.post("/chat/completions", json=STREAM)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "overloaded"
            assert requests_total(url, 503, provider="up") == 0, "latgate's own limit is not the provider's 5xx"
            assert requests_total(url, 503, provider="none") == 1
            assert len(up.requests) == 2  # not sent, not retried
            assert metric(url, "latgate_retries_total") == 0
            state = endpoint_state(url)
            assert (state["healthy"], state["failures"], state["consecutive_failures"]) == (True, 0, 0), state
        finally:
            up.release()
            for stream in streams:
                stream.__exit__(None, None, None)


def endless_event(first_token: bool):
    """A stream whose next event never ends: 64 KiB pieces of one ``data:`` line
    (after a first token when ``first_token``), until the connection breaks."""

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        if first_token:
            writer.write(chunk(content("one")))
        writer.write(chunk(b'data: {"choices": [{"delta": {"content": "'))
        piece = chunk(b"x" * 65536)
        while True:
            writer.write(piece)
            await writer.drain()

    return handler


def test_an_event_past_max_event_bytes_before_the_first_token_is_502_without_health_mark() -> None:
    with RawUpstream(endless_event(False)) as up, latgate(up, defaults="max_event_bytes = 1048576") as url:
        answer = httpx.post(url + "/v1/chat/completions", json=STREAM, timeout=30)
        assert answer.status_code == 502
        assert answer.json()["error"]["code"] == "response_too_large"
        assert "max_event_bytes" in answer.json()["error"]["message"]
        up.wait_until(lambda: up.open == 0)  # the upstream was closed, not read on
        assert len(up.requests) == 1  # not retried
        state = endpoint_state(url)
        assert (state["healthy"], state["failures"]) == (True, 0), state


def test_an_event_past_max_event_bytes_mid_stream_ends_the_stream_with_an_error_event() -> None:
    with RawUpstream(endless_event(True)) as up, latgate(up, defaults="max_event_bytes = 1048576") as url:
        with httpx.stream("POST", url + "/v1/chat/completions", json=STREAM, timeout=30) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        assert '"one"' in lines[0]
        error = lines[-1]
        assert error.startswith('data: {"error"') and "max_event_bytes" in error
        assert sum(len(line) for line in lines) < 4096  # the oversized event was never forwarded
        up.wait_until(lambda: up.open == 0)
        assert endpoint_state(url)["healthy"] is True


async def big_answer(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A 3 MiB JSON answer, chunked (no content-length to refuse it by)."""
    await up.request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    writer.write(chunk(b'{"choices": [{"message": {"content": "'))
    for _ in range(48):
        writer.write(chunk(b"y" * 65536))
        await writer.drain()
    writer.write(chunk(b'"}}]}') + b"0\r\n\r\n")
    await writer.drain()


def test_a_body_past_max_response_bytes_is_502_without_health_mark() -> None:
    with RawUpstream(big_answer) as up, latgate(up, defaults="max_response_bytes = 1048576") as url:
        answer = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert answer.status_code == 502
        assert "max_response_bytes" in answer.json()["error"]["message"]
        assert len(up.requests) == 1
        state = endpoint_state(url)
        assert (state["healthy"], state["failures"]) == (True, 0), state
