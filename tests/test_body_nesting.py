"""A body nested deeper than latgate re-encodes (:data:`latgate.forwarding.wire.MAX_NESTING`
levels of arrays and objects) is refused with a 400 in its API's envelope, wherever the
deep value sits (a message, a tool schema, an Anthropic ``tool_use`` input), and
nothing reaches the upstream; a body at the limit is forwarded as parsed. Through a
real gateway and a raw upstream on loopback, with the openai and anthropic SDKs."""

from __future__ import annotations

import anthropic
import httpx
import openai
import orjson
import pytest
from h1_upstreams import OK_JSON, SECRET, RawUpstream, json_reply, keep_serving
from stack import gateway

from latgate.forwarding.wire import MAX_NESTING

CONFIG = (
    "[defaults]\ntimeout_sec = 10\nconnect_timeout_sec = 2\nmax_retries = 0\n"
    '[providers.up]\napi_base = "{base}"\napi_key_env = "UP_KEY"\n'
)


def nested(levels: int) -> object:
    """``levels`` arrays, one inside the other."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.fixture(scope="module")
def stack():
    with (
        RawUpstream(keep_serving(json_reply(OK_JSON))) as up,
        gateway(CONFIG.format(base=up.base_url), env={"UP_KEY": SECRET}) as gw,
    ):
        yield up, gw


def _openai(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0, timeout=10)


# levels counted from the body's own object: {"messages": [{"meta": <n arrays>}]} is n + 3
TOO_DEEP = nested(MAX_NESTING - 2)
# (a tool_use input is sent upstream as a string of JSON: only its own depth counts there)


@pytest.mark.parametrize(
    "where",
    [
        {"messages": [{"role": "user", "content": "hi", "meta": TOO_DEEP}]},
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"default": TOO_DEEP}}}],
        },
    ],
    ids=["in-a-message", "in-a-tool-schema"],
)
def test_a_chat_body_nested_too_deep_is_a_400_in_the_openai_envelope(stack, where: dict) -> None:
    up, gw = stack
    before = len(up.requests)
    with pytest.raises(openai.BadRequestError) as refused:
        _openai(gw).chat.completions.create(model="m", **where)
    assert refused.value.status_code == 400
    error = refused.value.body
    assert error["type"] == "invalid_request_error"
    assert f"nested too deeply: at most {MAX_NESTING} levels" in error["message"]
    assert len(up.requests) == before


@pytest.mark.parametrize(
    "where",
    [
        {"tools": [{"name": "f", "input_schema": {"type": "object", "default": TOO_DEEP}}]},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": nested(MAX_NESTING)}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
            ]
        },
    ],
    ids=["in-a-tool-schema", "in-a-tool-use-input"],
)
def test_a_messages_body_nested_too_deep_is_a_400_in_the_anthropic_envelope(stack, where: dict) -> None:
    up, gw = stack
    before = len(up.requests)
    client = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0, timeout=10)
    request = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **where}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(**request)
    assert refused.value.status_code == 400
    body = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert f"nested too deeply: at most {MAX_NESTING} levels" in body["error"]["message"]
    assert len(up.requests) == before


def test_a_body_at_the_nesting_limit_is_forwarded_as_parsed(stack) -> None:
    up, gw = stack
    before = len(up.requests)
    deepest = {"model": "m", "messages": [{"role": "user", "content": "hi", "meta": nested(MAX_NESTING - 3)}]}
    raw = orjson.dumps(deepest)
    answer = httpx.post(gw.v1 + "/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=10)
    assert answer.status_code == 200, answer.text
    up.wait_until(lambda: len(up.requests) == before + 1)
    assert orjson.loads(up.requests[-1].split(b"\r\n\r\n", 1)[1]) == deepest
