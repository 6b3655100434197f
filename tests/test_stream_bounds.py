"""A stream that goes on without end is cut: an upstream sending keep-alive comments
after its first content holds a stream and its slot no longer than ``max_stream_sec``
(latgate's own limit: 504 ``stream_max_duration`` in the access line, nothing against
the upstream's health) nor, once content came, longer than ``timeout_sec`` of reads
without content (``stream_timeout``, the upstream's failure, as silence is). Either
ends with an error event in the route's envelope and no ``[DONE]``. Through a real
gateway and a raw upstream on loopback."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from apis import BODIES
from completions import DONE, chat_chunk, content, event
from h1_upstreams import SSE_HEAD, RawUpstream, access_lines, chunk, config, in_flight
from stack import gateway

#: keep-alives the upstream sends after its first content before it would finish (at
#: 20 ms each, ~20 s: far past both bounds the tests set, and an end if they do not hold)
KEEPALIVES = 1000


async def _keeps_alive(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One content chunk, then ``: keep-alive`` every 20 ms, then (if still read) the end."""
    while True:
        await up.request(reader)
        writer.write(SSE_HEAD + chunk(content("partial")))
        await writer.drain()
        for _ in range(KEEPALIVES):
            await asyncio.sleep(0.02)  # the upstream's pace, not a synchronisation
            writer.write(chunk(b": keep-alive\n\n"))
            await writer.drain()
        writer.write(chunk(event(chat_chunk({}, finish_reason="stop")) + DONE) + b"0\r\n\r\n")
        await writer.drain()


def _stream(url: str, body: dict) -> tuple[int, str]:
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as answer:
        return answer.status_code, answer.read().decode()


@pytest.mark.parametrize("api", ["/chat/completions", "/messages"], ids=["chat", "messages"])
def test_keepalives_after_content_end_at_max_stream_sec(api: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with RawUpstream(_keeps_alive) as up:
        text = config(up.base_url, timeout=600, extra="max_stream_sec = 1\n")
        with gateway(text, env={"UP_KEY": "k"}) as gw:
            status, body = _stream(gw.v1 + api, BODIES[api])
            assert in_flight(gw.v1) == 0  # the slot is released
            providers = httpx.get(gw.url + "/admin/providers").json()["providers"]
    assert status == 200 and "partial" in body, body
    assert "[DONE]" not in body and "message_stop" not in body, body
    assert "max_stream_sec" in body, body
    if api == "/messages":  # the route's own envelope: an Anthropic error event
        assert "event: error" in body, body
    else:
        (error,) = [json.loads(line[6:])["error"] for line in body.splitlines() if line.startswith("data: {\"error\"")]
        assert error["type"] == "api_error"
    (line,) = [line for line in access_lines(caplog) if line["path"] == "/v1" + api]
    assert (line["status"], line["error"]) == (504, "stream_max_duration")
    endpoint = providers["up"]["endpoints"][0]
    assert (endpoint["consecutive_failures"], endpoint["failures"]) == (0, 0), endpoint  # latgate's own limit


def test_keepalives_after_content_do_not_reset_the_silence_bound(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with RawUpstream(_keeps_alive) as up, gateway(config(up.base_url, timeout=1), env={"UP_KEY": "k"}) as gw:
        status, body = _stream(gw.v1 + "/chat/completions", BODIES["/chat/completions"])
    assert status == 200 and "partial" in body and "[DONE]" not in body, body
    assert "only keep-alives for timeout_sec (1 s) after content" in body, body
    (line,) = [line for line in access_lines(caplog) if line["path"] == "/v1/chat/completions"]
    assert (line["status"], line["error"]) == (502, "stream_timeout")
