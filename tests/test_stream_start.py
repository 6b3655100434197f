"""What an upstream sends before a stream's first content must be an event stream: an
HTML error page, random bytes or a JSON error body answered as a 200
``text/event-stream`` (or a JSON body as ``application/json``) is the provider's
failure, caught before any of it reaches the client: failed over to the next
candidate, else a 502 in the route's envelope (a JSON error object is relayed as the
upstream's error, redacted). After content, a stream passes through untouched as
before. Raw upstreams on loopback, the openai and anthropic SDKs and httpx.
"""

from __future__ import annotations

import asyncio
import logging

import anthropic
import httpx
import openai
import pytest
from completions import DONE, ROLE, chat_chunk, content, event
from h1_upstreams import (
    SECRET,
    SSE_HEAD,
    RawUpstream,
    access_lines,
    assert_clean_logs,
    chunk,
    fallback_config,
    stack_on,
)
from stack import gateway

from latgate.forwarding.stream_start import StreamStart

STOP = event(chat_chunk({}, finish_reason="stop"))
GOOD_STREAM = ROLE + content("Hello") + STOP + DONE
MESSAGES = [{"role": "user", "content": "hi"}]
JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
#: what a bad upstream writes (each names an internal address and echoes the key: never shown)
HTML_PAGE = b"<html><body><h1>502 Bad Gateway</h1>10.0.0.7:8443 " + SECRET.encode() + b"</body></html>\n"
GARBAGE = {
    "html-page": HTML_PAGE,
    "random-bytes": b"\x00\xff\x13\x8a garbage 10.0.0.7:8443\n\n",
    "plain-text": b"Internal Server Error\n",
    "json-error": b'{"error": {"message": "upstream overloaded at 10.0.0.7:8443", "type": "server_error"}}',
}
SHOWN = {
    "html-page": "answered a stream with an HTML page instead of an event stream",
    "random-bytes": "answered a stream with other bytes instead of an event stream",
    "plain-text": "answered a stream with other bytes instead of an event stream",
    "json-error": "provider 'up': upstream overloaded at",
}


def answering(head: bytes, *pieces: bytes, hold: bool = False):
    """An upstream answering ``head`` and ``pieces`` (chunked), then ending the body, or
    holding the connection open until released (``hold``)."""

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        writer.write(head)
        for piece in pieces:
            writer.write(chunk(piece))
            await writer.drain()
        if hold:
            await up.released.wait()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return handler


def error_counts(url: str, kind: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    prefix = f'latgate_upstream_errors_total{{kind="{kind}",provider="up"}} '
    return sum(float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize("name", list(GARBAGE))
@pytest.mark.parametrize("hold", [False, True], ids=["then-end", "then-hold"])
def test_garbage_before_the_first_content_fails_over_and_never_reaches_the_client(name: str, hold: bool, caplog) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    with (
        RawUpstream(answering(SSE_HEAD, GARBAGE[name], hold=hold)) as bad,
        RawUpstream(answering(SSE_HEAD, GOOD_STREAM)) as spare,
        gateway(fallback_config(bad.base_url, spare.base_url), env={"UP_KEY": SECRET}) as gw,
    ):
        client = openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0, timeout=15)
        raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        kind = "error_event" if name == "json-error" else "bad_response"
        assert error_counts(gw.url, kind) == 1  # the provider's failure, counted against it
        bad.release()
    assert raw.headers["x-latgate-provider"] == "spare"
    assert text == "Hello"
    assert len(bad.posts()) == 1 and len(spare.posts()) == 1
    (line,) = access_lines(caplog)
    assert line["status"] == 200 and line["attempts"] == 2
    assert_clean_logs(caplog)


@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_with_nothing_left_to_try_is_a_clear_502(name: str, caplog) -> None:
    request = {"model": "m", "messages": MESSAGES, "stream": True}
    with (
        stack_on(answering(SSE_HEAD, GARBAGE[name])) as (_, v1, _app),
        httpx.stream("POST", v1 + "/chat/completions", json=request, timeout=15) as r,
    ):
        body = r.read()
    assert r.status_code == 502 and r.headers["content-type"].startswith("application/json")
    message = httpx.Response(502, content=body).json()["error"]["message"]
    assert SHOWN[name] in message, message
    assert SECRET not in message and "10.0.0.7:8443" not in message and "<html>" not in message
    assert_clean_logs(caplog)


def test_a_json_client_error_answered_to_a_stream_is_the_upstream_s_400_not_retried() -> None:
    too_long = b'{"error": {"message": "This model\'s maximum context length is 4096 tokens", "type": "invalid_request_error"}}'
    with (
        RawUpstream(answering(JSON_HEAD, too_long)) as bad,
        RawUpstream(answering(SSE_HEAD, GOOD_STREAM)) as spare,
        gateway(fallback_config(bad.base_url, spare.base_url), env={"UP_KEY": SECRET}) as gw,
    ):
        client = openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0, timeout=15)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert "maximum context length is 4096 tokens" in caught.value.body["message"]
    assert spare.posts() == []


def test_garbage_on_v1_messages_is_an_anthropic_api_error(caplog) -> None:
    with stack_on(answering(SSE_HEAD, HTML_PAGE)) as (_, v1, _app):
        client = anthropic.Anthropic(base_url=v1.removesuffix("/v1"), api_key="k", max_retries=0, timeout=15)
        with (
            pytest.raises(anthropic.APIStatusError) as caught,
            client.messages.stream(model="m", max_tokens=16, messages=MESSAGES) as stream,
        ):
            stream.get_final_message()
    assert caught.value.status_code == 502
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "api_error", body
    assert "an HTML page instead of an event stream" in body["error"]["message"]
    assert_clean_logs(caplog)


def test_garbage_after_the_keep_alive_head_ends_the_stream_with_an_error_event_and_no_garbage(caplog) -> None:
    """The head and a keep-alive went out before the upstream wrote anything: its HTML
    page then ends the response with one error event, none of the page's bytes."""

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        writer.write(SSE_HEAD)
        await writer.drain()
        await up.released.wait()  # released once the client saw a keep-alive
        writer.write(chunk(HTML_PAGE) + b"0\r\n\r\n")
        await writer.drain()

    with RawUpstream(handler) as up:
        config = (
            "[defaults]\ntimeout_sec = 30\nconnect_timeout_sec = 2\nfirst_token_timeout_sec = 20\nmax_retries = 0\n"
            f'first_token_keepalive_sec = 0.05\n[providers.up]\napi_base = "{up.base_url}"\napi_key_env = "UP_KEY"\n'
        )
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        with (
            gateway(config, env={"UP_KEY": SECRET}) as gw,
            httpx.stream("POST", gw.v1 + "/chat/completions", json=body, timeout=15) as r,
        ):
            received = b""
            for piece in r.iter_raw():
                received += piece
                if b": keep-alive" in received:
                    up.release()
    assert r.status_code == 200 and received.startswith(b": keep-alive")
    assert b"<html>" not in received and SECRET.encode() not in received and b"[DONE]" not in received
    assert received.count(b"data: ") == 1 and b"an HTML page instead of an event stream" in received
    assert_clean_logs(caplog)


def test_bytes_that_are_not_sse_after_content_pass_through_untouched() -> None:
    """Only what comes before the first content is looked at: afterwards the stream is
    relayed as the upstream wrote it (the hot path reads no more than before)."""
    pieces = (ROLE + content("Hello"), b"<not sse>\n\n", STOP + DONE)
    stream = b"".join(pieces)
    with stack_on(answering(SSE_HEAD, *pieces)) as (_, v1, _app):
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        with httpx.stream("POST", v1 + "/chat/completions", json=body, timeout=15) as r:
            received = r.read()
    assert r.status_code == 200 and received == stream


SSE_STARTS = [
    b": ping\n\n" + ROLE,
    b"\xef\xbb\xbfevent: ping\r\ndata: {}\r\n\r\n",
    b"id: 7\nretry: 3000\ndata\n\n",
    b"\n\n: OPENROUTER PROCESSING\n\ndata:" + b"x" * 40 + b"\n\n",
]
NOT_SSE = [
    (HTML_PAGE, "an HTML page"),
    (b'{"error": "busy"}', "a JSON body"),
    (b": ping\n\n<!doctype html>", "an HTML page"),
    (b"datax: 1\n", "other bytes"),
    (b"Internal Server Error", "other bytes"),
]


def feed_split(data: bytes, at: int) -> tuple[int, str]:
    start = StreamStart()
    for offset, piece in ((0, data[:at]), (at, data[at:])):
        found = start.feed(piece)
        if found >= 0:
            return offset + found, start.what
    return -1, ""


@pytest.mark.parametrize("data", SSE_STARTS)
def test_an_event_stream_start_passes_the_check_however_it_is_split(data: bytes) -> None:
    for at in range(len(data) + 1):
        assert feed_split(data, at) == (-1, ""), at


@pytest.mark.parametrize(("data", "what"), NOT_SSE)
def test_a_start_that_is_not_sse_is_named_however_it_is_split(data: bytes, what: str) -> None:
    for at in range(len(data) + 1):
        offset, named = feed_split(data, at)
        assert named == what and 0 <= offset <= len(data), at
