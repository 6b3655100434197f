"""An upstream that writes latgate's own key into stream bytes that are not JSON error
objects (an ``event: error`` block with plain-text data, a ``data:`` line of broken
JSON, a ``: debug auth=Bearer ...`` comment), before the first content or after it,
never shows it to a client: through a real gateway and a raw upstream on loopback, on
chat completions, the translated ``/v1/messages`` and ``/v1/responses``, and a
``/v1/responses`` passed through to a provider that serves it."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from apis import BODIES
from completions import DONE, chat_chunk, content, event
from h1_upstreams import SSE_HEAD, RawUpstream, access_lines, chunk, config
from stack import gateway

KEY = "sk-leak-Zx81Qm2Lp0Rt7Vb3Hn5K"

#: how each shape writes the key it was sent (``@KEY@``) into the stream
SHAPES = {
    "event": b"event: error\ndata: upstream auth failed for Authorization: Bearer @KEY@\n\n",
    "broken": b'data: {"debug": "auth=Bearer @KEY@", "key": "@KEY@"\n\n',
    "comment": b": debug auth=Bearer @KEY@ key=@KEY@\n\n",
}
FINISH = event(chat_chunk({}, finish_reason="stop")) + DONE
#: a Responses API stream's events (OpenAI API reference, "Streaming events")
RESPONSES_DELTA = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"i",'
    b'"output_index":0,"content_index":0,"delta":"partial"}\n\n'
)
RESPONSES_DONE = (
    b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"r","object":"response",'
    b'"status":"completed","output":[],"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":2}}}\n\n'
)


async def _hostile(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request as its ``model`` says (``SHAPE-first`` / ``SHAPE-mid``,
    ``responses-`` in front for a Responses stream), echoing the key of its Authorization."""
    while True:
        request = await up.request(reader)
        head, _, body = request.partition(b"\r\n\r\n")
        auth = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"authorization:"))
        key = auth.split(b" ", 2)[-1]
        mode = json.loads(body)["model"]
        responses = mode.startswith("responses-")
        shape, _, when = mode.removeprefix("responses-").partition("-")
        hostile = SHAPES[shape].replace(b"@KEY@", key)
        first = RESPONSES_DELTA if responses else content("partial")
        end = RESPONSES_DONE if responses else FINISH
        if when == "first":
            writer.write(SSE_HEAD + chunk(hostile + first + end) + b"0\r\n\r\n")
        else:  # after output began: written once the client has "partial"
            writer.write(SSE_HEAD + chunk(first))
            await writer.drain()
            await up.released.wait()
            writer.write(chunk(hostile + end) + b"0\r\n\r\n")
        await writer.drain()


def _assert_no_key(text: str) -> None:
    """No run of 8 or more of the key's characters, in any case, in ``text``."""
    folded = text.lower()
    for start in range(len(KEY) - 7):
        assert KEY[start : start + 8].lower() not in folded, text


def _stream(up: RawUpstream, url: str, body: dict) -> tuple[int, str]:
    """(status, raw body as received) of a stream; the upstream goes on past its first
    content once the client has read it."""
    raw = b""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=15) as answer:
        for piece in answer.iter_raw():
            raw += piece
            if b"partial" in raw:
                up.release()
    return answer.status_code, raw.decode()


ROUTES = ["/chat/completions", "/messages", "/responses"]


@pytest.mark.parametrize("when", ["first", "mid"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("api", ROUTES, ids=["chat", "messages", "responses"])
def test_a_key_in_stream_bytes_that_are_not_chunks_never_reaches_the_client(
    api: str, shape: str, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with RawUpstream(_hostile) as up, gateway(config(up.base_url), env={"UP_KEY": KEY}) as gw:
        status, text = _stream(up, gw.v1 + api, {**BODIES[api], "model": f"{shape}-{when}"})
    _assert_no_key(text)
    if shape in ("event", "broken"):  # an in-band error (data that is not JSON too): a failure, not a success
        assert status == 502 if when == "first" else (status == 200 and "partial" in text and "error" in text), text
        assert "[DONE]" not in text
    else:
        assert status == 200 and "partial" in text, text
    for line in access_lines(caplog):
        _assert_no_key(json.dumps(line))


@pytest.mark.parametrize("when", ["first", "mid"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_key_in_a_passed_through_responses_stream_never_reaches_the_client(shape: str, when: str) -> None:
    with RawUpstream(_hostile) as up, gateway(config(up.base_url, extra="responses_api = true\n"), env={"UP_KEY": KEY}) as gw:
        status, text = _stream(up, gw.v1 + "/responses", {**BODIES["/responses"], "model": f"responses-{shape}-{when}"})
    _assert_no_key(text)
    if shape in ("event", "broken"):
        assert status == 502 if when == "first" else "error" in text, text
    else:
        assert status == 200 and "partial" in text and "response.completed" in text, text
        assert "event: response.output_text.delta\n" in text  # a Responses event's own name is kept


def test_a_comment_reaches_the_client_as_a_bare_keepalive() -> None:
    with RawUpstream(_hostile) as up, gateway(config(up.base_url), env={"UP_KEY": KEY}) as gw:
        status, text = _stream(up, gw.v1 + "/chat/completions", {**BODIES["/chat/completions"], "model": "comment-mid"})
    assert status == 200 and text.endswith("data: [DONE]\n\n"), text
    assert "\n\n:\n\n" in text and "debug" not in text, text
