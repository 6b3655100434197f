"""The Anthropic Messages API end to end: the official ``anthropic`` SDK (and Claude
Code's raw request shape) through the gateway to simulators and replayed upstreams."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import anthropic
import httpx
import orjson
import pydantic
import pytest
from completions import DONE, chat_chunk, event
from replay import ReplayScript, ReplayServer, load_expect, load_stream
from stack import FAST, Stack, demo_stack, gateway, one_upstream_config, replay_gateway, simulators

from latgate.commands.sim import SimOptions

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CLAUDE = "claude-sonnet-4-5"


@pytest.fixture(scope="module")
def demo() -> Iterator[Stack]:
    # Engines stop by themselves after 24 tokens (finish "stop"): Claude Code asks for
    # max_tokens 32000, and a smaller max_tokens ends in "length".
    tile, vllm, tao = (
        SimOptions(name=name, max_output_tokens=24, **FAST) for name in ("tile-rt", "vllm", "taotoken")
    )
    with demo_stack(tile=tile, vllm=vllm, tao=tao) as stack:
        yield stack


def sdk(url: str, **options) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="sk-client", max_retries=0, **options)


@contextlib.contextmanager
def replayed(script: ReplayScript | list[ReplayScript]) -> Iterator[tuple[ReplayServer, anthropic.Anthropic]]:
    with replay_gateway(script) as (upstream, gw):
        yield upstream, sdk(gw.url)


def streamed_message(client: anthropic.Anthropic, **request) -> anthropic.types.Message:
    """The message the SDK assembles from a stream (``messages.stream`` + ``get_final_message``)."""
    with client.messages.stream(**request) as events:
        return events.get_final_message()


# -- text -----------------------------------------------------------------------------


def test_claude_model_name_is_routed_and_answered_under_its_own_name(demo: Stack) -> None:
    raw = sdk(demo.url).messages.with_raw_response.create(model=CLAUDE, max_tokens=5, messages=ASK)
    message = raw.parse()
    assert raw.headers["x-latgate-provider"] == "vllm"
    assert raw.headers["x-latgate-upstream-model"] == "glm-5.1"
    assert (message.model, message.role, message.type) == (CLAUDE, "assistant", "message")
    assert message.stop_reason == "max_tokens"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.output_tokens == 5 and message.usage.input_tokens > 0
    assert demo.sims["vllm"].stats.last_request.body["max_tokens"] == 5


def test_streamed_text_equals_the_unstreamed_message(demo: Stack) -> None:
    client = sdk(demo.url)
    whole = client.messages.create(model=CLAUDE, max_tokens=200, messages=ASK)
    with client.messages.stream(model=CLAUDE, max_tokens=200, messages=ASK) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason == "end_turn"
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_stream_events_come_in_the_anthropic_order(demo: Stack) -> None:
    with sdk(demo.url).messages.create(model=CLAUDE, max_tokens=3, messages=ASK, stream=True) as events:
        names = [event.type for event in events]
    assert names == ["message_start", "content_block_start"] + ["content_block_delta"] * 3 + [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


# -- tools ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(demo: Stack, stream: bool) -> None:
    client = sdk(demo.url)
    request = {"model": CLAUDE, "max_tokens": 300, "tools": [WEATHER]}
    if stream:
        first = streamed_message(client, **request, messages=ASK)
    else:
        first = client.messages.create(**request, messages=ASK)
    assert first.stop_reason == "tool_use"
    (call,) = [block for block in first.content if block.type == "tool_use"]
    assert (call.name, call.input) == ("get_weather", {"city": "city"})
    history = [
        *ASK,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees"}],
        },
    ]
    second = client.messages.create(**request, messages=history)
    assert second.stop_reason == "end_turn"
    assert [block.type for block in second.content] == ["text"]
    upstream = demo.sims["vllm"].stats.last_request.body["messages"]
    assert upstream[-2]["tool_calls"][0]["id"] == call.id
    assert upstream[-1] == {"role": "tool", "tool_call_id": call.id, "content": "18 degrees"}


def test_tool_choice_naming_a_tool_forces_that_tool(demo: Stack) -> None:
    other = {
        "name": "get_time",
        "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    }
    message = sdk(demo.url).messages.create(
        model=CLAUDE,
        max_tokens=100,
        messages=ASK,
        tools=[WEATHER, other],
        tool_choice={"type": "tool", "name": "get_time"},
    )
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == [
        ("get_time", {"tz": "tz"})
    ]


def test_recorded_parallel_tool_calls_are_reassembled_by_the_sdk() -> None:
    with replayed(ReplayScript.sse(load_stream("tool_calls"))) as (_, client):
        final = streamed_message(client, model="m", max_tokens=100, messages=ASK, tools=[WEATHER])
    expect = load_expect("tool_calls")
    assert [(b.id, b.name, b.input) for b in final.content] == [
        (t["id"], t["name"], json.loads(t["arguments"])) for t in expect.tool_calls
    ]
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens == expect.usage["completion_tokens"]


def test_upstream_quirks_still_give_a_clean_tool_use_message() -> None:
    chunks = (
        chat_chunk({"role": "assistant", "content": "", "tool_calls": []}, finish_reason=""),
        chat_chunk({"content": "Reading it.", "tool_calls": []}, finish_reason=""),
        chat_chunk(
            {
                "tool_calls": [
                    {"id": "call_9", "type": "function", "function": {"name": "read_file", "arguments": ""}}
                ]
            },
            finish_reason="",
        ),
        chat_chunk({"tool_calls": [{"function": {"arguments": '{"path": '}}]}),
        chat_chunk({"tool_calls": [{"function": {"arguments": '"src/app.py"}'}}]}),
        chat_chunk({}, finish_reason="tool_calls"),
    )
    body = b"".join(map(event, chunks)) + DONE
    with replayed(ReplayScript.sse(body)) as (_, client):
        final = streamed_message(client, model="m", max_tokens=100, messages=ASK, tools=[WEATHER])
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "Reading it."
    assert (final.content[1].id, final.content[1].name, final.content[1].input) == (
        "call_9",
        "read_file",
        {"path": "src/app.py"},
    )


# -- thinking -------------------------------------------------------------------------


def test_reasoning_content_arrives_as_a_thinking_block_streamed_and_not() -> None:
    message = {"role": "assistant", "content": "4", "reasoning_content": "2+2"}
    whole = {
        "id": "chatcmpl-r",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    with replayed([ReplayScript.sse(load_stream("reasoning")), ReplayScript.json_response(200, whole)]) as (
        _,
        client,
    ):
        streamed = streamed_message(client, model="m", max_tokens=100, messages=ASK)
        unstreamed = client.messages.create(model="m", max_tokens=100, messages=ASK)
    expect = load_expect("reasoning")
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in streamed.content] == [
        ("thinking", expect.reasoning_text),
        ("text", expect.text),
    ]
    assert [b.type for b in unstreamed.content] == ["thinking", "text"]
    assert unstreamed.content[0].thinking == "2+2"


# -- what Claude Code sends -----------------------------------------------------------


def claude_code_body() -> dict:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    return {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "Use the tools.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                    image,
                    {"type": "text", "text": "fix the bug", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "look first", "signature": "EqQBCkYIBRgCKkD"},
                    {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "/app.py"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": [{"type": "text", "text": "print(1)"}],
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
        "tools": [
            {
                "name": "Read",
                "description": "Read a file",
                "input_schema": {
                    "type": "object",
                    "properties": {"file_path": {"type": "string"}},
                    "required": ["file_path"],
                },
            },
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        ],
        "tool_choice": {"type": "auto"},
        "metadata": {"user_id": "user_1a2b_account__session_3c4d"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "temperature": 1,
    }


@pytest.mark.parametrize(
    "auth",
    [{"x-api-key": "sk-gateway-key"}, {"authorization": "Bearer sk-gateway-key"}],
    ids=["x-api-key", "bearer"],
)
def test_a_claude_code_request_is_served_and_nothing_claude_only_reaches_the_engine(
    demo: Stack, auth: dict
) -> None:
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
        "user-agent": "claude-cli/2.0.0 (external, cli)",
        **auth,
    }
    r = httpx.post(demo.url + "/v1/messages?beta=true", json=claude_code_body(), headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    assert b"event: message_stop" in r.content
    received = demo.sims["vllm"].stats.last_request
    sent = received.body
    for dropped in ("thinking", "context_management", "output_config", "metadata", "system"):
        assert dropped not in sent
    assert b"cache_control" not in orjson.dumps(sent)
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["Read"]
    assert sent["user"] == "user_1a2b_account__session_3c4d"
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert "reasoning_content" not in sent["messages"][2]
    assert "sk-gateway-key" not in json.dumps(received.headers)
    assert not any(name.startswith("anthropic") for name in received.headers)


def test_sdk_beta_messages_with_betas_header_are_served(demo: Stack) -> None:
    message = sdk(demo.url).beta.messages.create(
        model="claude-haiku-4-5", max_tokens=4, messages=ASK, betas=["claude-code-20250219"]
    )
    assert message.model == "claude-haiku-4-5" and message.content[0].text


def test_count_tokens_answers_the_estimate_routing_uses(demo: Stack) -> None:
    client = sdk(demo.url)
    short = client.messages.count_tokens(model=CLAUDE, messages=ASK)
    long = client.messages.count_tokens(
        model=CLAUDE, messages=ASK, tools=[WEATHER], system="You are a careful assistant."
    )
    routed = client.messages.with_raw_response.create(
        model=CLAUDE, max_tokens=1, messages=ASK, tools=[WEATHER], system="You are a careful assistant."
    )
    assert 0 < short.input_tokens < long.input_tokens
    assert long.input_tokens == int(routed.headers["x-latgate-prompt-tokens"])
    beta = httpx.post(
        demo.url + "/v1/messages/count_tokens?beta=true", json={"model": CLAUDE, "messages": ASK}
    )
    assert beta.json() == {"input_tokens": short.input_tokens}


# -- latency marking ------------------------------------------------------------------


def test_latency_sensitive_alias_and_header_reach_the_decode_pool(demo: Stack) -> None:
    by_alias = sdk(demo.url).messages.with_raw_response.create(
        model="glm-5.1-highspeed", max_tokens=2, messages=ASK
    )
    by_header = sdk(demo.url, default_headers={"X-Latency-Sensitive": "1"}).messages.with_raw_response.create(
        model=CLAUDE, max_tokens=2, messages=ASK
    )
    assert by_alias.headers["x-latgate-provider"] == by_header.headers["x-latgate-provider"] == "tile-rt"
    assert by_alias.parse().model == "glm-5.1-highspeed"


# -- errors ---------------------------------------------------------------------------


def test_bad_request_gets_the_anthropic_envelope_and_no_retry(demo: Stack) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk(demo.url).messages.create(
            model=CLAUDE, max_tokens=5, messages=[{"role": "robot", "content": "hi"}]
        )
    body = caught.value.body
    assert body["type"] == "error"
    assert body["error"] == {
        "type": "invalid_request_error",
        "message": "messages.0.role: must be 'user' or 'assistant', not 'robot'",
    }
    assert caught.value.response.headers["x-should-retry"] == "false"
    not_json = httpx.post(
        demo.url + "/v1/messages", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_not_found_error() -> None:
    config = '[providers.p]\napi_base = "http://127.0.0.1:9/v1"\nmodels = ["a", "b"]\n'
    with gateway(config) as gw, pytest.raises(anthropic.NotFoundError) as caught:
        sdk(gw.url).messages.create(model=CLAUDE, max_tokens=5, messages=ASK)
    assert caught.value.body["error"]["type"] == "not_found_error"
    assert "available models: a, b" in caught.value.body["error"]["message"]


def test_upstream_rate_limit_is_a_rate_limit_error_with_retry_hints() -> None:
    limited = ReplayScript.json_response(
        429, {"error": {"message": "slow down"}}, headers=[("retry-after", "3")]
    )
    with replayed(limited) as (_, client), pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="m", max_tokens=5, messages=ASK)
    headers = caught.value.response.headers
    assert caught.value.body["error"]["type"] == "rate_limit_error"
    assert (headers["retry-after"], headers["x-should-retry"]) == ("3", "true")


def test_unreachable_upstream_is_an_api_error_without_its_address() -> None:
    with gateway(one_upstream_config("http://127.0.0.1:9/v1")) as gw:
        r = httpx.post(gw.url + "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": ASK})
    assert r.status_code == 502
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    assert "127.0.0.1:9" not in r.text and r.headers["x-should-retry"] == "true"


def test_upstream_dying_mid_stream_raises_in_the_sdk() -> None:
    body = load_stream("vllm_chat")
    partial = body[: body.index(b"data:", body.index(b'" How"'))]  # role, "Hello", "!", " How"
    with replayed(ReplayScript.sse(partial, end="drop")) as (_, client):
        received: list[str] = []
        with (
            pytest.raises(anthropic.APIError) as caught,
            client.messages.stream(model="m", max_tokens=100, messages=ASK) as events,
        ):
            received.extend(events.text_stream)
    assert "".join(received) == "Hello! How"
    assert "failed mid-stream" in str(caught.value)


# -- gateway keys ---------------------------------------------------------------------

AUTH_CONFIG = """
[defaults]
max_retries = 0

[providers.fast]
api_base = "{fast}/v1"
models = ["glm-5.1"]

[providers.slow]
api_base = "{slow}/v1"
models = ["glm-5.1"]

[routing]
default_route = "slow"
route_latency_sensitive_to = "fast"

[routing.policies.interactive]
latency_sensitive = true

[aliases]
"*" = "glm-5.1"  # Claude Code's own model names

[[auth.keys]]
name = "claude-code"
key = "sk-claude-code"

[[auth.keys]]
name = "headerless"
key = "sk-headerless"
policy = "interactive"
"""


def test_gateway_keys_as_x_api_key_or_bearer_and_a_keys_default_policy() -> None:
    options = {name: SimOptions(name=name, **FAST) for name in ("fast", "slow")}
    with simulators(options) as sims:
        config = AUTH_CONFIG.format(fast=sims["fast"][0], slow=sims["slow"][0])
        with gateway(config) as gw:
            by_api_key = anthropic.Anthropic(base_url=gw.url, api_key="sk-claude-code", max_retries=0)
            by_bearer = anthropic.Anthropic(base_url=gw.url, auth_token="sk-headerless", max_retries=0)
            plain = by_api_key.messages.with_raw_response.create(model=CLAUDE, max_tokens=2, messages=ASK)
            marked = by_bearer.messages.with_raw_response.create(model=CLAUDE, max_tokens=2, messages=ASK)
            assert by_bearer.messages.count_tokens(model=CLAUDE, messages=ASK).input_tokens > 0
            missing = httpx.post(
                gw.url + "/v1/messages", json={"model": CLAUDE, "max_tokens": 2, "messages": ASK}
            )
            wrong = httpx.post(
                gw.url + "/v1/messages/count_tokens", json={"messages": ASK}, headers={"x-api-key": "sk-nope"}
            )
        forwarded = json.dumps([sims[name][1].stats.last_request.headers for name in ("fast", "slow")])
    assert plain.headers["x-latgate-provider"] == "slow"
    assert (marked.headers["x-latgate-provider"], marked.headers["x-latgate-route-reason"]) == (
        "fast",
        "latency_sensitive",
    )
    for refused in (missing, wrong):
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        assert refused.headers["www-authenticate"].startswith("Bearer")
    assert "sk-claude-code" not in forwarded and "sk-headerless" not in forwarded


# -- conformance to the Anthropic SDK's own types --------------------------------------


def anthropic_events(raw: bytes) -> list[dict]:
    events = []
    for block in raw.decode().split("\n\n"):
        if block:
            fields = dict(line.split(": ", 1) for line in block.split("\n"))
            data = json.loads(fields["data"])
            assert data["type"] == fields["event"]
            events.append(data)
    return events


def test_messages_and_stream_events_validate_against_the_sdk_types(demo: Stack) -> None:
    adapter = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
    for extra in ({}, {"tools": [WEATHER]}, {"stop_sequences": ["never"], "temperature": 0.2}):
        body = {"model": CLAUDE, "max_tokens": 50, "messages": ASK, **extra}
        anthropic.types.Message.model_validate(httpx.post(demo.url + "/v1/messages", json=body).json())
        events = anthropic_events(
            httpx.post(demo.url + "/v1/messages", json={**body, "stream": True}).content
        )
        assert events[1] == {"type": "ping"}
        for sent in events[:1] + events[2:]:
            adapter.validate_python(sent)
    with replayed(ReplayScript.sse(load_stream("reasoning"))) as (_, client):
        raw = httpx.post(
            str(client.base_url) + "/v1/messages",
            json={"model": "m", "max_tokens": 50, "messages": ASK, "stream": True},
        )
    thinking = [adapter.validate_python(e) for e in anthropic_events(raw.content) if e["type"] != "ping"]
    assert thinking[1].content_block.type == "thinking"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
    ],
)
def test_upstream_statuses_map_to_anthropic_error_types_the_sdk_accepts(status: int, kind: str) -> None:
    with replayed(ReplayScript.json_response(status, {"error": {"message": "no"}})) as (_, client):
        r = httpx.post(
            str(client.base_url) + "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": ASK}
        )
    assert r.status_code == status
    error = anthropic.types.shared.ErrorResponse.model_validate(r.json())
    assert error.error.type == kind
