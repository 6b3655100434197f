"""``/v1/messages`` with malformed custom tools answers 400 ``invalid_request_error`` in
Anthropic's envelope naming the field, as Anthropic does, and sends nothing upstream;
server tools are still dropped on purpose. Through a real gateway, a raw upstream on
loopback and the anthropic SDK."""

from __future__ import annotations

import json

import anthropic
import pytest
from h1_upstreams import RawUpstream, config, json_reply, keep_serving
from stack import gateway

HI = [{"role": "user", "content": "hi"}]
ANSWER = json_reply(
    b'{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'
)
SCHEMA = {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"name": 5, "input_schema": SCHEMA}, "tools.0.name"),
        ({"input_schema": SCHEMA}, "tools.0.name"),
        ({"name": "", "input_schema": SCHEMA}, "tools.0.name"),
        ({"name": "x"}, "tools.0.input_schema"),
        ({"name": "x", "input_schema": "notanobject"}, "tools.0.input_schema"),
        ({"type": "custom", "name": "x", "input_schema": None}, "tools.0.input_schema"),
        ("not-a-tool", "tools.0"),
    ],
    ids=["name-int", "no-name", "empty-name", "no-schema", "schema-str", "custom-null-schema", "not-object"],
)
def test_a_malformed_custom_tool_is_a_400_in_anthropics_envelope(tool: object, param: str) -> None:
    with RawUpstream(keep_serving(ANSWER)) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="m", max_tokens=16, messages=HI, tools=[tool])  # type: ignore[list-item]
        assert up.requests == []
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert body["error"]["message"].startswith(param.rsplit(".", 1)[0]) and param.rsplit(".", 1)[-1] in body["error"]["message"], body


def test_server_tools_are_dropped_and_custom_tools_sent() -> None:
    tools = [{"type": "web_search_20250305", "name": "web_search"}, {"name": "get", "input_schema": SCHEMA}]
    with RawUpstream(keep_serving(ANSWER)) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
        message = client.messages.create(model="m", max_tokens=16, messages=HI, tools=tools)  # type: ignore[arg-type]
        assert message.content[0].text == "ok"
        sent = json.loads(up.requests[0].partition(b"\r\n\r\n")[2])
    assert [t["function"]["name"] for t in sent["tools"]] == ["get"]
