"""A body with a top-level key twice (or once plainly and once spelled with an escape)
reaches the upstream meaning exactly what latgate routed, authorized, limited and
counted on (the parsed body: the last of the duplicates), never as the client's bytes
with both: on chat completions, ``/v1/messages`` and ``/v1/responses`` (passed
through). Through a real gateway and a raw upstream on loopback."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from completions import DONE, content
from h1_upstreams import OK_JSON, SSE_HEAD, RawUpstream, chunk, json_reply
from stack import gateway

CLIENT_KEY = "sk-client-cheap-only"
CONFIG = f"""
[defaults]
timeout_sec = 10
connect_timeout_sec = 2
max_retries = 0

[providers.up]
api_base = "{{base}}"
models = ["cheap", "pricey"]
responses_api = true

[[auth.keys]]
name = "cheap-only"
key = "{CLIENT_KEY}"
models = ["cheap"]
"""
RESPONSE_JSON = (
    b'{"id":"resp_1","object":"response","status":"completed","model":"cheap","output":[{"type":"message",'
    b'"id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"ok",'
    b'"annotations":[]}]}],"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":2}}'
)
SSE_REPLY = SSE_HEAD + chunk(content("ok")) + chunk(DONE) + b"0\r\n\r\n"
BIG_TEXT = "x " * 50_000  # 100 KB


async def _answer(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        request = await up.request(reader)
        head, _, body = request.partition(b"\r\n\r\n")
        if orjson.loads(body).get("stream"):
            writer.write(SSE_REPLY)
        elif b" /v1/responses " in head.split(b"\r\n", 1)[0]:
            writer.write(json_reply(RESPONSE_JSON))
        else:
            writer.write(json_reply(OK_JSON))
        await writer.drain()


@pytest.fixture(scope="module")
def stack():
    with RawUpstream(_answer) as up, gateway(CONFIG.format(base=up.base_url + "/v1")) as gw:
        yield up, gw


def _messages(text: str) -> bytes:
    return orjson.dumps([{"role": "user", "content": text}])


def _body(api: str, members: bytes) -> bytes:
    """A request body of ``api`` with ``members`` (raw JSON members) first."""
    if api == "/chat/completions":
        rest = b'"messages":' + _messages("hi") if b'"messages"' not in members else b'"n":1'
    elif api == "/messages":
        rest = b'"max_tokens":16' + (b"" if b'"messages"' in members else b',"messages":' + _messages("hi"))
    else:
        rest = b'"input":"hi"' if b'"messages"' not in members else b'"max_output_tokens":16'
    if api == "/responses" and b'"messages"' in members:  # the Responses API's prompt is "input"
        members = members.replace(b'"messages"', b'"input"')
    return b"{" + members + b"," + rest + b"}"


def _post(stack, api: str, raw: bytes) -> tuple[httpx.Response, bytes]:
    """The gateway's answer to ``raw`` on ``api`` and the body the upstream got for it
    (each top-level key in it once, plainly spelled)."""
    up, gw = stack
    before = len(up.requests)
    answer = httpx.post(
        gw.v1 + api,
        content=raw,
        headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    up.wait_until(lambda: len(up.requests) == before + 1)
    sent = up.requests[before].partition(b"\r\n\r\n")[2]
    for key in orjson.loads(sent):  # each top-level key once, spelled plainly
        assert sent.count(orjson.dumps(key) + b":") == 1, sent[:300]
    return answer, sent


APIS = ["/chat/completions", "/messages", "/responses"]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    "model", [b'"model":"pricey","model":"cheap"', b'"mod\\u0065l":"pricey","model":"cheap"'], ids=["plain", "escaped"]
)
def test_a_duplicated_model_reaches_the_upstream_as_the_one_authorized(stack, api: str, model: bytes) -> None:
    _, sent = _post(stack, api, _body(api, model))
    assert orjson.loads(sent)["model"] == "cheap"
    assert b"pricey" not in sent


@pytest.mark.parametrize("api", APIS)
def test_a_duplicated_prompt_reaches_the_upstream_as_the_one_counted(stack, api: str) -> None:
    members = b'"model":"cheap","messages":' + _messages(BIG_TEXT) + b',"messages":' + _messages("short")
    answer, sent = _post(stack, api, _body(api, members))
    assert int(answer.headers["x-latgate-prompt-tokens"]) < 100
    assert len(sent) < 1000


@pytest.mark.parametrize("api", APIS)
def test_a_duplicated_stream_flag_reaches_the_upstream_as_the_one_served(stack, api: str) -> None:
    answer, sent = _post(stack, api, _body(api, b'"model":"cheap","stream":false,"stream":true'))
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert orjson.loads(sent)["stream"] is True


def test_a_body_too_deep_to_encode_with_a_duplicated_key_is_refused_not_forwarded(stack) -> None:
    """Such a body could only go as the client's bytes, which would carry both values
    (tests/test_body_nesting.py: every body nested too deep is refused)."""
    up, gw = stack
    before = len(up.requests)
    raw = b'{"model":"pricey","model":"cheap","messages":[{"role":"user","content":"hi","meta":' + b"[" * 300 + b"]" * 300 + b"}]}"
    answer = httpx.post(
        gw.v1 + "/chat/completions",
        content=raw,
        headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"},
        timeout=10,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert len(up.requests) == before
