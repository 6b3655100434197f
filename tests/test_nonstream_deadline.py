"""A non-streamed request is answered within its provider's ``timeout_sec`` whatever the
upstream does: an event stream sent to a ``stream: false`` request (keep-alive
comments, empty deltas) is refused at once as the provider's failure (502), and a JSON
answer trickling in a byte at a time (never silent for ``timeout_sec``) ends in 504
once ``timeout_sec`` has passed since the request was sent. ``first_token_timeout_sec``
does not apply: an engine writes a non-streamed answer only once it is all generated.
Keep-alive whitespace and ``: ping`` comment lines a hosted upstream writes meanwhile
are no answer, and are skipped when the JSON follows. Through a real gateway, raw
upstreams on loopback and the openai / anthropic SDKs."""

from __future__ import annotations

import asyncio
import logging

import anthropic
import httpx
import openai
import pytest
from h1_upstreams import (
    CHAT,
    OK_JSON,
    SECRET,
    RawUpstream,
    access_lines,
    assert_clean_logs,
    chunk,
    fallback_config,
    json_reply,
    keep_serving,
    stack_on,
)
from stack import gateway

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


JSON_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
#: keep-alives as hosted upstreams write them before a JSON answer
KEEPALIVES = [b"\n", b": ping\n\n", b": OPENROUTER PROCESSING\n\n", b" \r\n"]


async def _keepalives_forever(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A 200 JSON head, then keep-alives (at most ~20 s of them), never the answer."""
    await up.request(reader)
    writer.write(JSON_CHUNKED_HEAD)
    for i in range(400):
        writer.write(chunk(KEEPALIVES[i % len(KEEPALIVES)]))
        await writer.drain()
        await asyncio.sleep(0.05)


def test_keep_alives_are_not_an_answer_a_non_streamed_request_gets_504_at_timeout_sec(caplog) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    with stack_on(_keepalives_forever, timeout=2, ftt=1) as (_, v1, _app):
        client = openai.OpenAI(base_url=v1, api_key="k", max_retries=0, timeout=CLIENT_TIMEOUT_SECONDS)
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="m", messages=CHAT["messages"])
    assert caught.value.status_code == 504
    error = caught.value.body
    assert error["code"] == "upstream_timeout"
    assert "only keep-alives, no answer within timeout_sec (2 s)" in error["message"], error
    (line,) = access_lines(caplog)
    assert line["status"] == 504 and line["cause"] == "only keep-alives, no answer within timeout_sec (2 s)"
    assert_clean_logs(caplog)


def test_keep_alives_on_v1_messages_end_in_an_anthropic_timeout_error(caplog) -> None:
    with stack_on(_keepalives_forever, timeout=2, ftt=1) as (_, v1, _app):
        client = anthropic.Anthropic(base_url=v1.removesuffix("/v1"), api_key="k", max_retries=0, timeout=CLIENT_TIMEOUT_SECONDS)
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 504
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "timeout_error", body
    assert "timeout_sec" in body["error"]["message"]
    assert_clean_logs(caplog)


def test_a_non_streamed_generation_longer_than_the_first_token_timeout_is_answered_once(caplog) -> None:
    """A silent upstream past ``first_token_timeout_sec`` is generating the whole answer:
    it is waited for (up to ``timeout_sec``), neither cut nor sent to the fallback."""

    async def slow_generation(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        await asyncio.sleep(1.5)  # the upstream generating, three first-token timeouts long
        writer.write(json_reply())
        await writer.drain()

    caplog.set_level(logging.INFO, logger="latgate.access")
    with (
        RawUpstream(slow_generation) as slow,
        RawUpstream(keep_serving(json_reply())) as spare,
        gateway(fallback_config(slow.base_url, spare.base_url, ftt=0.5, timeout=20), env={"UP_KEY": SECRET}) as gw,
    ):
        client = openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0, timeout=CLIENT_TIMEOUT_SECONDS)
        answer = client.chat.completions.with_raw_response.create(model="m", messages=CHAT["messages"])
    assert answer.headers["x-latgate-provider"] == "up"
    assert answer.parse().choices[0].message.content == "ok"
    assert len(slow.posts()) == 1 and len(spare.posts()) == 0
    (line,) = access_lines(caplog)
    assert line["status"] == 200 and line["attempts"] == 1
    assert_clean_logs(caplog)


def test_a_silent_upstream_of_a_non_streamed_request_is_failed_over_at_timeout_sec(caplog) -> None:
    """No head at all within ``timeout_sec``: the fallback answers."""

    async def silent(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        await up.released.wait()

    caplog.set_level(logging.INFO, logger="latgate.access")
    with (
        RawUpstream(silent) as hung,
        RawUpstream(keep_serving(json_reply())) as spare,
        gateway(fallback_config(hung.base_url, spare.base_url, ftt=0.5, timeout=2), env={"UP_KEY": SECRET}) as gw,
    ):
        client = openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0, timeout=CLIENT_TIMEOUT_SECONDS)
        answer = client.chat.completions.with_raw_response.create(model="m", messages=CHAT["messages"])
        hung.release()
    assert answer.headers["x-latgate-provider"] == "spare"
    assert answer.parse().choices[0].message.content == "ok"
    assert len(hung.posts()) == 1 and len(spare.posts()) == 1
    (line,) = access_lines(caplog)
    assert line["status"] == 200 and line["attempts"] == 2
    assert_clean_logs(caplog)


def test_a_non_streamed_answer_after_keep_alives_is_answered_with_them_skipped() -> None:
    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        writer.write(JSON_CHUNKED_HEAD)
        for piece in [*KEEPALIVES, b": a comment split ", b"across reads\n"]:
            writer.write(chunk(piece))
            await writer.drain()
        writer.write(chunk(OK_JSON[:10]) + chunk(OK_JSON[10:]) + b"0\r\n\r\n")
        await writer.drain()

    with stack_on(handler, timeout=30, ftt=5) as (_, v1, _app):
        client = openai.OpenAI(base_url=v1, api_key="k", max_retries=0, timeout=CLIENT_TIMEOUT_SECONDS)
        completion = client.chat.completions.create(model="m", messages=CHAT["messages"])
    assert completion.choices[0].message.content == "ok"
