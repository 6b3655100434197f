"""An upstream that trickles its response head (a byte at a time, never silent for
``timeout_sec``) is cut off once ``timeout_sec`` has passed since the request was sent,
streamed or not: a 504 in the client's envelope, the cause in the access log, and the
attempt retried elsewhere only because nothing had reached the client. Through a real
gateway and a raw upstream on loopback."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from h1_upstreams import CHAT, STREAM, RawUpstream, access_lines, assert_clean_logs, stack_on

#: far past the gateway's bounds: the test's own guard, never reached when latgate keeps them
CLIENT_TIMEOUT_SECONDS = 30
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n" + b"x-pad: " + b"a" * 2000


async def _trickled_head(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Each request's head one byte every 20 ms (40 s in all), never finished."""
    while True:
        await up.request(reader)
        for byte in HEAD:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("body", [CHAT, STREAM], ids=["non-streamed", "streamed"])
def test_a_trickled_response_head_is_cut_off_at_timeout_sec_with_504(body: dict, caplog) -> None:
    caplog.set_level("INFO", logger="latgate.access")
    extra = "first_token_keepalive_sec = 0\n"  # the stream's head is held: the 504 is its status
    with stack_on(_trickled_head, timeout=1, ftt=60, retries=1, extra=extra) as (up, v1, _app):
        answer = httpx.post(v1 + "/chat/completions", json=body, timeout=CLIENT_TIMEOUT_SECONDS)
        assert len(up.requests) == 2  # retried: nothing had reached the client
    assert answer.status_code == 504, answer.text
    assert "no whole response head" in answer.json()["error"]["message"]
    access = access_lines(caplog)[-1]
    assert access["status"] == 504 and "no whole response head" in access["cause"], access
    assert_clean_logs(caplog)
