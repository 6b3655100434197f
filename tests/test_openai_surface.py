"""The OpenAI surface as the official ``openai`` SDK sees it through the gateway: tool
calls (parallel too), ``n > 1``, ``reasoning_content``, ``response_format`` and
logprobs pass through; model lookups; retry hints; the fallback model in the headers;
conformance of tool-call and multi-choice traffic to the official OpenAI spec."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest
from openapi import validate
from replay import ReplayScript, ReplayServer, load_expect, load_stream
from stack import FAST, Stack, gateway, replay_gateway, simulators

from latgate.commands.sim import SimOptions

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@contextlib.contextmanager
def replayed(
    script: ReplayScript | list[ReplayScript], *, max_retries: int = 0
) -> Iterator[tuple[ReplayServer, openai.OpenAI]]:
    """A replay upstream behind a gateway (which does not retry), and an openai client for it."""
    with replay_gateway(script) as (upstream, gw):
        yield upstream, openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=max_retries)


def client_for(stack: Stack, *, max_retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.v1, api_key="k", max_retries=max_retries)


def streamed_tool_calls(stream) -> dict[int, dict]:
    calls: dict[int, dict] = {}
    for chunk in stream:
        for choice in chunk.choices:
            for fragment in choice.delta.tool_calls or ():
                call = calls.setdefault(fragment.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = call["id"] or fragment.id
                if fragment.function is not None:
                    call["name"] += fragment.function.name or ""
                    call["arguments"] += fragment.function.arguments or ""
    return calls


# -- tool calls -----------------------------------------------------------------------


def test_parallel_tool_calls_stream_through_byte_for_byte_and_the_sdk_assembles_both() -> None:
    body = load_stream("tool_calls")
    with replayed(ReplayScript.sse(body)) as (_, client):
        raw = httpx.post(
            str(client.base_url).rstrip("/") + "/chat/completions",
            json={"model": "m", "messages": ASK, "stream": True, "stream_options": {"include_usage": True}},
        )
        assert raw.content == body
        calls = streamed_tool_calls(
            client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], stream=True)
        )
    expect = load_expect("tool_calls")
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == [
        (t["id"], t["name"], json.loads(t["arguments"])) for t in expect.tool_calls
    ]


def test_tool_use_round_trip_with_the_openai_sdk_streamed_and_not(demo: Stack) -> None:
    client = client_for(demo)
    first = client.chat.completions.create(model="glm-5.1", messages=ASK, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "city"})
    streamed = streamed_tool_calls(
        client.chat.completions.create(model="glm-5.1", messages=ASK, tools=[WEATHER], stream=True)
    )
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed.values()] == [
        ("get_weather", {"city": "city"})
    ]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees"},
    ]
    second = client.chat.completions.create(model="glm-5.1", messages=history, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


# -- n > 1 ----------------------------------------------------------------------------


def test_n2_stream_keeps_choice_indexes_and_matches_the_unstreamed_choices(demo: Stack) -> None:
    client = client_for(demo)
    request = {"model": "glm-5.1", "messages": ASK, "n": 2, "max_tokens": 6}
    texts: dict[int, str] = {}
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    whole = client.chat.completions.create(**request)
    assert texts == {choice.index: choice.message.content for choice in whole.choices}
    assert texts[0] != texts[1]


def test_recorded_interleaved_n2_stream_keeps_its_indexes() -> None:
    with replayed(ReplayScript.sse(load_stream("n2_interleaved"))) as (_, client):
        texts: dict[int, str] = {}
        for chunk in client.chat.completions.create(model="m", messages=ASK, n=2, stream=True):
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == load_expect("n2_interleaved").text_by_choice


# -- reasoning, response_format, logprobs ---------------------------------------------


def test_reasoning_content_reaches_the_sdk_streamed_and_not() -> None:
    message = {"role": "assistant", "content": "42", "reasoning_content": "six times seven"}
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }
    script = [ReplayScript.sse(load_stream("reasoning")), ReplayScript.json_response(200, body)]
    with replayed(script) as (_, client):
        reasoning = "".join(
            (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            for chunk in client.chat.completions.create(model="m", messages=ASK, stream=True)
            if chunk.choices
        )
        whole = client.chat.completions.create(model="m", messages=ASK)
    assert reasoning == load_expect("reasoning").reasoning_text
    assert whole.choices[0].message.model_extra["reasoning_content"] == "six times seven"


def test_response_format_and_logprob_options_reach_the_engine_unchanged(demo: Stack) -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {
            "name": "answer",
            "strict": True,
            "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
        },
    }
    client_for(demo).chat.completions.create(
        model="glm-5.1", messages=ASK, response_format=response_format, logprobs=True, top_logprobs=2, seed=7
    )
    sent = demo.sims["vllm"].stats.last_request.body
    assert (sent["response_format"], sent["logprobs"], sent["top_logprobs"], sent["seed"]) == (
        response_format,
        True,
        2,
        7,
    )


def test_logprobs_in_the_answer_reach_the_sdk() -> None:
    logprobs = {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.1,
                "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105]}],
            }
        ],
        "refusal": None,
    }
    body = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi", "refusal": None},
                "logprobs": logprobs,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    with replayed(ReplayScript.json_response(200, body)) as (_, client):
        answer = client.chat.completions.create(model="m", messages=ASK, logprobs=True, top_logprobs=1)
    validate(answer.model_dump(mode="json", exclude_unset=True), "CreateChatCompletionResponse")
    assert answer.choices[0].logprobs.content[0].top_logprobs[0].logprob == -0.1


# -- models ---------------------------------------------------------------------------


def test_model_lookup_by_id_with_a_slash_and_unknown_ids_as_not_found() -> None:
    config = '[providers.sglang]\napi_base = "http://127.0.0.1:9/v1"\nmodels = ["meta-llama/Meta-Llama-3-8B-Instruct"]\n[aliases]\n"llama-3-8b-instruct" = "meta-llama/Meta-Llama-3-8B-Instruct"\n'
    with gateway(config) as gw:
        client = client_for(gw)
        for name in ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b-instruct"):
            assert client.models.retrieve(name).id == name
            validate(httpx.get(f"{gw.v1}/models/{name}").json(), "Model")
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("gpt-nope")
        validate(httpx.get(gw.v1 + "/models/gpt-nope").json(), "ErrorResponse")


# -- retry hints ----------------------------------------------------------------------

OK_ANSWER = {
    "id": "chatcmpl-3",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}
RATE_LIMITED = ReplayScript.json_response(
    429, {"error": {"message": "slow down", "type": "rate_limit_error"}}, headers=[("retry-after", "0.01")]
)


def test_a_client_error_says_do_not_retry_and_the_sdk_sends_it_once() -> None:
    bad = ReplayScript.json_response(
        400,
        {
            "error": {
                "message": "max_tokens is too large",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": None,
            }
        },
    )
    with replayed(bad, max_retries=2) as (upstream, client):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="m", messages=ASK, max_tokens=10**6)
        assert caught.value.response.headers["x-should-retry"] == "false"
        assert caught.value.param == "max_tokens"
        assert len(upstream.requests) == 1


def test_a_rate_limit_passes_on_retry_after_and_says_retry() -> None:
    with replayed(RATE_LIMITED) as (_, client):
        r = httpx.post(
            str(client.base_url).rstrip("/") + "/chat/completions", json={"model": "m", "messages": ASK}
        )
    assert r.status_code == 429
    assert (r.headers["retry-after"], r.headers["x-should-retry"]) == ("0.01", "true")
    validate(r.json(), "ErrorResponse")


def test_the_sdk_retries_a_rate_limit_after_the_hinted_delay_and_succeeds() -> None:
    with replayed([RATE_LIMITED, ReplayScript.json_response(200, OK_ANSWER)], max_retries=1) as (
        upstream,
        client,
    ):
        assert client.chat.completions.create(model="m", messages=ASK).choices[0].message.content == "ok"
        assert len(upstream.requests) == 2


@pytest.mark.parametrize("status", [500, 503, 504])
def test_upstream_failures_say_retry_and_match_the_error_schema(status: int) -> None:
    with replayed(
        ReplayScript.json_response(status, {"error": {"message": "boom", "type": "server_error"}})
    ) as (_, client):
        r = httpx.post(
            str(client.base_url).rstrip("/") + "/chat/completions", json={"model": "m", "messages": ASK}
        )
    assert r.status_code == status
    assert r.headers["x-should-retry"] == "true"
    validate(r.json(), "ErrorResponse")


# -- fallback model -------------------------------------------------------------------

FALLBACK_CONFIG = """
[defaults]
max_retries = 0

[providers.fast]
api_base = "{fast}/v1"
models = ["glm-5.1-highspeed"]

[providers.slow]
api_base = "{slow}/v1"
models = ["glm-5.1"]

[routing]
default_route = "fast"
fallbacks = {{ fast = ["slow"] }}

[models."glm-5.1-highspeed"]
fallback_model = "glm-5.1"
"""


@pytest.mark.parametrize("stream", [False, True])
def test_falling_back_to_the_fallback_model_is_reported_in_the_headers(stream: bool) -> None:
    sims = {"fast": SimOptions(name="fast", error_rate=1.0, **FAST), "slow": SimOptions(name="slow", **FAST)}
    with simulators(sims) as running:
        config = FALLBACK_CONFIG.format(fast=running["fast"][0], slow=running["slow"][0])
        with gateway(config) as gw:
            client = client_for(gw)
            raw = client.chat.completions.with_raw_response.create(
                model="glm-5.1-highspeed", messages=ASK, stream=stream
            )
            if stream:
                models = {chunk.model for chunk in raw.parse()}
            else:
                models = {raw.parse().model}
            assert raw.headers["x-latgate-provider"] == "slow"
            assert raw.headers["x-latgate-route-reason"] == "fallback:fast"
            assert raw.headers["x-latgate-fallback-model"] == "glm-5.1"
            assert models == {"glm-5.1-highspeed"}
            assert running["slow"][1].stats.last_request.body["model"] == "glm-5.1"


def test_no_fallback_model_header_when_the_primary_answers(demo: Stack) -> None:
    raw = client_for(demo).chat.completions.with_raw_response.create(model="glm-5.1-highspeed", messages=ASK)
    assert raw.headers["x-latgate-provider"] == "tile-rt"
    assert "x-latgate-fallback-model" not in raw.headers


# -- conformance of tool-call and multi-choice traffic ---------------------------------


@pytest.mark.parametrize("extra", [{"tools": [WEATHER]}, {"n": 2}], ids=["tool_calls", "n2"])
def test_tool_call_and_multi_choice_traffic_matches_the_openai_spec(demo: Stack, extra: dict) -> None:
    body = {"model": "glm-5.1", "messages": ASK, **extra}
    validate(httpx.post(demo.v1 + "/chat/completions", json=body).json(), "CreateChatCompletionResponse")
    r = httpx.post(
        demo.v1 + "/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = [e for e in r.content.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    for event in events[:-1]:
        validate(orjson.loads(event.removeprefix(b"data: ")), "CreateChatCompletionStreamResponse")
