"""An upstream that echoes latgate's own key in a successful answer (a chunk's ``id``,
``model``, ``system_fingerprint`` or text; a whole answer's ``id``, ``model`` or text;
written as is or with ``/`` as ``\\/``; a stream's event cut inside the key between two
writes) never shows it to a client or a log line, on every route: chat completions,
completions, the translated ``/v1/messages`` and ``/v1/responses``, and ``/v1/responses``
passed through to a provider that serves it; streamed and not. Through a real gateway
and a raw upstream on loopback, read with httpx. (latgate has no native Anthropic
upstream: ``/v1/messages`` is always translated.)"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from apis import BODIES
from completions import decoded_answer
from h1_upstreams import SSE_HEAD, RawUpstream, access_lines, chunk, config, json_reply
from sse_tap import tap_pieces
from stack import gateway

from latgate.forwarding.sse import StreamTap

#: a key with a ``/`` in it (base64-style), as some gateways issue
KEY = "sk-proj-Echo/Zx81Qm2Lp0Rt7Vb3Hn5K"
SLASHED = KEY.replace("/", "\\/")


def _sse(value: object) -> bytes:
    return b"data: " + json.dumps(value).encode() + b"\n\n"


def _chat_events(key: str) -> list[bytes]:
    """A chat stream echoing ``key`` in each place a chunk carries text; the content
    event's JSON writes ``/`` as ``\\/``."""
    head = {"id": f"chatcmpl-{key}", "object": "chat.completion.chunk", "created": 1, "model": key, "system_fingerprint": key}
    role = _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    text = _sse({**head, "choices": [{"index": 0, "delta": {"content": f"partial {key} end"}}]})
    finish = _sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return [role, text.replace(key.encode(), key.replace("/", "\\/").encode()), finish, b"data: [DONE]\n\n"]


def _completion_events(key: str) -> list[bytes]:
    head = {"id": f"cmpl-{key}", "object": "text_completion", "created": 1, "model": key}
    text = _sse({**head, "choices": [{"index": 0, "text": f"partial {key} end", "finish_reason": None}]})
    finish = _sse({**head, "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
    return [text, finish, b"data: [DONE]\n\n"]


def _responses_events(key: str) -> list[bytes]:
    delta = {"type": "response.output_text.delta", "item_id": f"msg_{key}", "output_index": 0, "content_index": 0}
    done = {"type": "response.completed", "response": {"id": f"resp_{key}", "object": "response", "status": "completed",
            "output": [], "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}}  # fmt: skip
    return [
        b"event: response.output_text.delta\n" + _sse({**delta, "delta": f"partial {key} end"}),
        b"event: response.completed\n" + _sse(done),
    ]


def _whole(path: str, key: str) -> bytes:
    """A non-streamed answer for ``path`` echoing ``key`` in its id, model and text."""
    usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    if path == "/responses":
        message = {"type": "message", "id": f"msg_{key}", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": f"partial {key} end", "annotations": []}]}  # fmt: skip
        usage = {"input_tokens": 1, "output_tokens": 3, "total_tokens": 4}
        return json.dumps({"id": f"resp_{key}", "object": "response", "status": "completed", "model": key,
                           "output": [message], "usage": usage}).encode()  # fmt: skip
    if path == "/completions":
        choice = {"index": 0, "text": f"partial {key} end", "finish_reason": "stop"}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": f"partial {key} end"}, "finish_reason": "stop"}
    answer = {"id": f"chatcmpl-{key}", "object": "chat.completion", "created": 1, "model": key,
              "system_fingerprint": key, "choices": [choice], "usage": usage}  # fmt: skip
    return json.dumps(answer).encode().replace(b"partial " + key.encode(), b"partial " + key.replace("/", "\\/").encode())


EVENTS = {"/chat/completions": _chat_events, "/completions": _completion_events, "/responses": _responses_events}


async def _echo(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request on its path, echoing the key of its Authorization; a
    stream's events each in its own chunked write, the one echoing the key in its text
    cut inside the key."""
    while True:
        request = await up.request(reader)
        head, _, body = request.partition(b"\r\n\r\n")
        path = head.split(b" ", 2)[1].decode().removeprefix("/v1")
        auth = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"authorization:"))
        key = auth.split(b" ", 2)[-1].decode()
        if not json.loads(body).get("stream"):
            writer.write(json_reply(_whole(path, key)))
            await writer.drain()
            continue
        writer.write(SSE_HEAD)
        for event in EVENTS[path](key):
            cut = event.find(b"partial ")
            for piece in (event[: cut + 12], event[cut + 12 :]) if cut >= 0 else (event,):
                writer.write(chunk(piece))
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def _assert_no_key(text: str) -> None:
    """No echo of the key in ``text``, as sent or as a client decodes its JSON."""
    joined = decoded_answer(text)
    assert KEY not in joined and SLASHED not in joined and "Zx81Qm2Lp0Rt7Vb3Hn5K" not in joined, joined
    assert "<redacted>" in joined, joined  # replaced where it stood, the rest kept
    assert "partial" in joined and "end" in joined, joined


CASES = [
    ("/chat/completions", ""),
    ("/completions", ""),
    ("/messages", ""),  # translated to chat completions
    ("/responses", ""),  # translated to chat completions
    ("/responses", "responses_api = true\n"),  # passed through
]
IDS = ["chat", "completions", "messages", "responses-translated", "responses-passthrough"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize(("api", "extra"), CASES, ids=IDS)
def test_a_key_echoed_in_a_successful_answer_never_reaches_the_client(
    api: str, extra: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    body = {**BODIES[api], "model": "m", "stream": stream}
    with RawUpstream(_echo) as up, gateway(config(up.base_url, extra=extra), env={"UP_KEY": KEY}) as gw:
        answer = httpx.post(gw.v1 + api, json=body, timeout=15)
    assert answer.status_code == 200, answer.text
    _assert_no_key(answer.text)
    if not stream:  # the length is the redacted body's
        assert int(answer.headers["content-length"]) == len(answer.content)
        json.loads(answer.content)
    lines = access_lines(caplog)
    assert lines and all(line["status"] == 200 for line in lines), lines
    for record in caplog.records:
        assert "Zx81Qm2Lp0Rt7Vb3Hn5K" not in record.getMessage(), record.getMessage()


@pytest.mark.parametrize("events", [_chat_events, _completion_events, _responses_events], ids=["chat", "completions", "responses"])
def test_a_key_split_between_any_two_reads_is_redacted_and_nothing_else_changes(events) -> None:
    stream = b"".join(events(KEY))
    whole, _ = tap_pieces([stream], StreamTap(secrets=(KEY.encode(),)))
    assert KEY.encode() not in whole and SLASHED.encode() not in whole and b"<redacted>" in whole
    plain = b"".join(events("placeholder-key"))
    assert whole.replace(b"<redacted>", b"placeholder-key") == plain  # only the key was touched
    for cut in range(1, len(stream)):
        forwarded, _ = tap_pieces([stream[:cut], stream[cut:]], StreamTap(secrets=(KEY.encode(),)))
        assert forwarded == whole, cut


def test_a_short_key_is_not_searched_for_in_answers() -> None:
    """A key under 8 characters would match inside ordinary text and JSON: left alone."""
    stream = b"".join(_chat_events("abc"))
    forwarded, _ = tap_pieces([stream], StreamTap(secrets=(b"abc",)))
    assert forwarded == stream


def test_each_key_of_several_is_redacted_in_every_json_form() -> None:
    keys = (b'key-with-"quote"-and-\\-0123', b"second/key/0123456789")
    chunk = json.dumps({"a": keys[0].decode(), "b": keys[1].decode(), "c": "@"}).encode()
    chunk = chunk.replace(b"@", keys[1].replace(b"/", b"\\/"))  # "\/" as PHP writes "/"
    forwarded, _ = tap_pieces([b"data: " + chunk + b"\n\n"], StreamTap(secrets=keys))
    assert b"0123" not in forwarded and forwarded.count(b"<redacted>") == 3, forwarded
