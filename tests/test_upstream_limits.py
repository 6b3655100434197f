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
from h1_upstreams import SECRET, RawUpstream, chunk, content
from stack import gateway

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
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{") and 'provider="up"' in line)


def endpoint_state(url: str) -> dict:
    return httpx.get(url + "/admin/providers").json()["providers"]["up"]["endpoints"][0]


def test_a_full_pool_is_503_overloaded_without_retry_or_health_mark() -> None:
    with RawUpstream(held_stream) as up, latgate(up, provider="max_connections = 2") as url:
        with httpx.Client(base_url=url + "/v1", timeout=10) as client:
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
                assert len(up.requests) == 2  # not sent, not retried
                assert metric(url, "latgate_retries_total") == 0
                state = endpoint_state(url)
                assert (state["healthy"], state["failures"], state["consecutive_failures"]) == (True, 0, 0), state
            finally:
                up.release()
                for stream in streams:
                    stream.__exit__(None, None, None)
