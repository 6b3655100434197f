"""A non-streamed request is answered within its provider's ``timeout_sec`` whatever the
upstream does: an event stream sent to a ``stream: false`` request (keep-alive
comments, empty deltas) is refused at once as the provider's failure (502), and a JSON
answer trickling in a byte at a time (never silent for ``timeout_sec``) ends in 504
once ``timeout_sec`` has passed since the request was sent. Through a real gateway and
a raw upstream on loopback."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from h1_upstreams import CHAT, OK_JSON, RawUpstream, assert_clean_logs, stack_on

EMPTY_DELTA = b'data: {"id":"a","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
EVENT_STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
#: far past the gateway's bounds: the test's own guard, never reached when latgate keeps them
CLIENT_TIMEOUT_SECONDS = 30


def _repeating(head: bytes, piece: bytes, *, times: int, gap_seconds: float):
    """An upstream answering ``head`` then ``piece`` ``times`` times, ``gap_seconds`` apart."""

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        writer.write(head)
        for _ in range(times):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(gap_seconds)

    return handler


@pytest.mark.parametrize("event", [b": ping\n\n", EMPTY_DELTA], ids=["pings", "empty-deltas"])
def test_an_event_stream_answering_a_non_streamed_request_is_refused_as_502(event: bytes, caplog) -> None:
    with stack_on(_repeating(EVENT_STREAM_HEAD, event, times=400, gap_seconds=0.25), timeout=4, ftt=3) as (_, v1, _app):
        answer = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=CLIENT_TIMEOUT_SECONDS)
    assert answer.status_code == 502, answer.text
    assert "text/event-stream" in answer.json()["error"]["message"]
    assert_clean_logs(caplog)


def test_a_json_answer_trickling_in_is_cut_off_at_timeout_sec_with_504(caplog) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(OK_JSON)
    handler = _repeating(head, b" ", times=600, gap_seconds=0.05)  # never silent for 50 ms; 30 s in all
    with stack_on(handler, timeout=1, ftt=1) as (_, v1, _app):
        answer = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=CLIENT_TIMEOUT_SECONDS)
    assert answer.status_code == 504, answer.text
    assert "timeout_sec" in answer.json()["error"]["message"]
    assert_clean_logs(caplog)
