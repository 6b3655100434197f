"""Upstream answers of an odd shape, on every API latgate serves, through a real gateway
and a raw upstream on loopback:

- a malformed ``usage`` (counts that are strings or negative, a details member that is
  not an object) is tolerated: the answer is translated with latgate's own estimate,
  and the access log says ``usage_estimated: true`` with latgate's counts;
- assistant ``content`` as a list of parts (Mistral-style) is translated as its text;
- no choice, a null message, or ``choices`` that is not a list is the provider's
  failure (502 in the client's envelope), never an empty success nor a raw chat body.
"""

from __future__ import annotations

import asyncio
import json
import logging

import anthropic
import httpx
import openai
import pytest
from apis import BODIES
from completions import DONE, ROLE, chat_chunk, content, event
from h1_upstreams import SSE_HEAD, RawUpstream, access_lines, chunk, config, json_reply
from processes import poll
from stack import gateway

BAD_USAGE = {
    "strings": {"prompt_tokens": "many", "completion_tokens": -1, "prompt_tokens_details": "x"},
    "details": {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": "x", "completion_tokens_details": [1]},
    "lots": {"prompt_tokens": -5, "completion_tokens": "lots"},
    "not-object": "lots",
}
TEXT = "hello there, this is the answer"


def _answer(choices: object, usage: object = None) -> bytes:
    body: dict = {"id": "c", "object": "chat.completion", "model": "m", "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return json_reply(json.dumps(body).encode())


def _choice(message: object) -> list[dict]:
    return [{"index": 0, "message": message, "finish_reason": "stop"}]


def _reply(mode: str, stream: bool) -> bytes:
    kind, _, name = mode.partition(":")
    if kind == "usage" and stream:
        events = ROLE + content(TEXT) + event(chat_chunk({}, finish_reason="stop"))
        events += event({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": BAD_USAGE[name]})
        return SSE_HEAD + chunk(events + DONE) + b"0\r\n\r\n"
    if kind == "usage":
        return _answer(_choice({"role": "assistant", "content": TEXT}), BAD_USAGE[name])
    shapes = {
        "parts": _choice({"role": "assistant", "content": [{"type": "text", "text": "listy "}, {"type": "text", "text": "text"}]}),
        "no-choice": [],
        "null-message": _choice(None),
        "choices-str": "nope",
    }
    return _answer(shapes[name])


async def _serve(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        body = json.loads((await up.request(reader)).partition(b"\r\n\r\n")[2])
        writer.write(_reply(body["model"], bool(body.get("stream"))))
        await writer.drain()


@pytest.fixture
def v1(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO)
    with RawUpstream(_serve) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        yield gw.v1


def _access_after(caplog: pytest.LogCaptureFixture, before: int) -> dict:
    """The access line of the request made after ``before`` lines were logged (it is
    written once the answer was handed to the server: waited for, bounded)."""
    return poll(lambda: access_lines(caplog)[before:], timeout=10, what="the access line", interval=0.01)[-1]


@pytest.mark.parametrize("name", list(BAD_USAGE))
def test_a_malformed_usage_is_latgates_estimate_on_every_api(v1: str, name: str, caplog: pytest.LogCaptureFixture) -> None:
    mode = f"usage:{name}"
    chat = openai.OpenAI(base_url=v1, api_key="x", max_retries=0)
    before = len(access_lines(caplog))
    answer = chat.chat.completions.create(model=mode, messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == TEXT
    line = _access_after(caplog, before)
    valid = name == "details"  # counts fine, only the details malformed
    assert line["usage_estimated"] is not valid, line
    assert line["completion_tokens"] == 3 if valid else line["completion_tokens"] > 0, line  # the upstream's, or latgate's count

    before = len(access_lines(caplog))
    message = anthropic.Anthropic(base_url=v1.removesuffix("/v1"), api_key="x", max_retries=0).messages.create(
        model=mode, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].text == TEXT
    assert message.usage.output_tokens > 0 and message.usage.input_tokens > 0
    assert _access_after(caplog, before)["usage_estimated"] is not valid

    before = len(access_lines(caplog))
    response = chat.responses.create(model=mode, input="hi")
    assert response.output_text == TEXT and response.status == "completed"
    assert response.usage.output_tokens > 0 and response.usage.input_tokens > 0
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert _access_after(caplog, before)["usage_estimated"] is not valid


@pytest.mark.parametrize("name", list(BAD_USAGE))
def test_a_malformed_usage_in_a_stream_is_latgates_estimate_on_every_api(v1: str, name: str, caplog: pytest.LogCaptureFixture) -> None:
    mode = f"usage:{name}"
    valid = name == "details"
    for api in ("/chat/completions", "/messages", "/responses"):
        before = len(access_lines(caplog))
        text = httpx.post(v1 + api, json={**BODIES[api], "model": mode, "stream": True}, timeout=15).text
        assert "hello there" in text and "error" not in text.replace('"error":null', ""), (api, text)
        line = _access_after(caplog, before)
        assert line["status"] == 200 and line["usage_estimated"] is not valid and line["completion_tokens"] > 0, (api, line)
    completed = json.loads(next(x for x in text.split("\n") if x.startswith("data:") and "response.completed" in x)[5:])
    assert completed["response"]["usage"]["output_tokens"] > 0


def test_content_as_a_list_of_parts_is_translated_as_its_text(v1: str) -> None:
    message = anthropic.Anthropic(base_url=v1.removesuffix("/v1"), api_key="x", max_retries=0).messages.create(
        model="shape:parts", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    assert [block.text for block in message.content] == ["listy text"]
    response = openai.OpenAI(base_url=v1, api_key="x", max_retries=0).responses.create(model="shape:parts", input="hi")
    assert response.output_text == "listy text"


@pytest.mark.parametrize("name", ["no-choice", "null-message", "choices-str"])
@pytest.mark.parametrize("api", ["/messages", "/responses"])
def test_an_answer_without_a_message_is_the_providers_failure_in_the_clients_envelope(v1: str, api: str, name: str) -> None:
    answer = httpx.post(v1 + api, json={**BODIES[api], "model": f"shape:{name}"}, timeout=15)
    assert answer.status_code == 502, answer.text
    body = answer.json()
    if api == "/messages":
        assert body["type"] == "error" and body["error"]["type"] == "api_error"
    else:
        assert set(body) == {"error"} and body["error"]["type"] == "api_error"
    assert "provider 'up'" in body["error"]["message"] and "chat.completion" not in answer.text


# -- translated streams never drop what they cannot decode --------------------------------

BAD_UTF8 = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"bad \xff\xfe here"},"finish_reason":null}]}\n\n'
FINISH = event(chat_chunk({}, finish_reason="stop"))
STREAMS = {
    "bad-utf8": ROLE + BAD_UTF8 + FINISH + DONE,
    "bom": b"\xef\xbb\xbf" + content("bom ") + content("text") + FINISH + DONE,
    "not-json": ROLE + content("before ") + b"data: {not json\n\n" + content("after") + FINISH + DONE,
}


@pytest.fixture
def streaming_v1(caplog: pytest.LogCaptureFixture):
    async def serve(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = json.loads((await up.request(reader)).partition(b"\r\n\r\n")[2])
            writer.write(SSE_HEAD + chunk(STREAMS[body["model"]]) + b"0\r\n\r\n")
            await writer.drain()

    caplog.set_level(logging.INFO)
    with RawUpstream(serve) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        yield gw.v1


def _messages_text(v1: str, mode: str) -> str:
    client = anthropic.Anthropic(base_url=v1.removesuffix("/v1"), api_key="x", max_retries=0)
    with client.messages.stream(model=mode, max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as stream:
        return "".join(stream.text_stream)


def _responses_text(v1: str, mode: str) -> str:
    client = openai.OpenAI(base_url=v1, api_key="x", max_retries=0)
    events = list(client.responses.create(model=mode, input="hi", stream=True))
    assert events[-1].type == "response.completed", events[-1]
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


@pytest.mark.parametrize("read", [_messages_text, _responses_text], ids=["messages", "responses"])
def test_invalid_utf8_and_a_bom_in_a_translated_stream_keep_their_text(streaming_v1: str, read) -> None:
    assert read(streaming_v1, "bad-utf8") == "bad \ufffd\ufffd here"
    assert read(streaming_v1, "bom") == "bom text"


def test_an_event_that_is_not_json_ends_a_translated_stream_with_an_error(
    streaming_v1: str, caplog: pytest.LogCaptureFixture
) -> None:
    # the event comes in the read of the first content: a failure before the stream's head
    # (502), or, read after it, an error event ending the stream (response.failed)
    with pytest.raises(anthropic.APIStatusError):
        _messages_text(streaming_v1, "not-json")
    with pytest.raises((AssertionError, openai.APIStatusError), match="response.failed|502|not JSON"):
        _responses_text(streaming_v1, "not-json")
    def both() -> list[dict]:
        lines = [x for x in access_lines(caplog) if x["model"] == "not-json"]
        return lines if len(lines) == 2 else []

    lines = poll(both, timeout=10, what="both access lines", interval=0.01)
    assert all(x["status"] == 502 and x["error"] in ("stream_bad_event", "upstream_error") for x in lines), lines
