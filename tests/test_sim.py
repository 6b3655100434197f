"""The engine simulator: wire format, timing model on virtual time, tools, faults, CLI."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import struct
import subprocess
import sys
from typing import Any

import httpx
import jsonschema
import openai
import orjson
import pytest
from servers import serve_app

from latgate.commands.sim import SimOptions, VirtualClock, create_sim_app, profile_for
from latgate.commands.sim.cli import add_arguments, argv_for, options_from_args
from latgate.commands.sim.replies import arguments_for
from latgate.foundation.config.schema import EndpointConfig, ProviderConfig
from latgate.routing.tokens import estimate_prompt_tokens

FAST = SimOptions(tpot_ms=0.0, tpot_growth_ms=0.0, ttft_overhead_ms=0.0, default_max_tokens=8)
USER = [{"role": "user", "content": "How fast is the decode pool?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "detailed": {"type": "boolean"},
                "hours": {"type": "array", "items": {"type": "number"}, "minItems": 2},
                "where": {
                    "type": "object",
                    "properties": {"lat": {"type": "number"}, "note": {"type": "string"}},
                    "required": ["lat"],
                },
                "optional_field": {"type": "string"},
            },
            "required": ["city", "unit", "days", "detailed", "hours", "where"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


def sse_events(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an SSE response: parsed JSON, or the string ``[DONE]``."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else orjson.loads(data))
    return events


def stream_chat(client: httpx.Client, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse_events(response)


# -- wire format -----------------------------------------------------------------------


def test_stream_sends_role_chunk_then_tokens_finish_usage_and_done():
    body = {"model": "glm-5.1", "messages": USER, "max_tokens": 5, "stream_options": {"include_usage": True}}
    with serve_app(create_sim_app(FAST)) as url, httpx.Client(base_url=url) as client:
        events = stream_chat(client, body)
    role, *tokens, finish, usage_chunk, done = events
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [len(t["choices"]) for t in tokens] == [1] * 5
    assert all(t["choices"][0]["delta"]["content"] for t in tokens)
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": estimate_prompt_tokens({**body, "stream": True}),
        "completion_tokens": 5,
        "total_tokens": estimate_prompt_tokens({**body, "stream": True}) + 5,
    }
    assert done == "[DONE]"
    chunks = events[:-1]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["id"].startswith("chatcmpl-")
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {"glm-5.1"}


def test_stream_without_include_usage_has_no_usage_chunk():
    with serve_app(create_sim_app(FAST)) as url, httpx.Client(base_url=url) as client:
        events = stream_chat(client, {"model": "m", "messages": USER, "max_tokens": 3})
    assert events[-1] == "[DONE]"
    assert all(e["choices"] and "usage" not in e for e in events[:-1])


def test_non_stream_reply_reports_usage_counted_with_the_routing_estimator():
    long_cjk = "请总结以下内容：" + "测试" * 2000
    body = {"model": "m", "messages": [{"role": "user", "content": long_cjk}], "max_completion_tokens": 7}
    with serve_app(create_sim_app(FAST)) as url:
        reply = httpx.post(url + "/v1/chat/completions", json=body).json()
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["finish_reason"] == "length"
    assert len(reply["choices"][0]["message"]["content"].split()) == 7
    prompt_tokens = estimate_prompt_tokens(body)
    assert prompt_tokens > 4000
    assert reply["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 7,
        "total_tokens": prompt_tokens + 7,
    }


def test_reply_without_max_tokens_has_default_length_and_stops():
    with serve_app(create_sim_app(FAST)) as url:
        reply = httpx.post(url + "/chat/completions", json={"model": "m", "messages": USER}).json()
    assert reply["usage"]["completion_tokens"] == FAST.default_max_tokens
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_is_capped_by_max_output_tokens():
    options = dataclasses.replace(FAST, max_output_tokens=12)
    with serve_app(create_sim_app(options)) as url:
        reply = httpx.post(url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 32000}).json()
    assert reply["usage"]["completion_tokens"] == 12
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_same_request_gets_the_same_text_and_other_requests_differ():
    def ask(content: str) -> str:
        body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 12}
        return httpx.post(url + "/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]

    with serve_app(create_sim_app(FAST)) as url:
        first, again, other = ask("hello"), ask("hello"), ask("something else")
    assert first == again
    assert first != other


def test_n_2_streams_interleaved_choices_with_their_indexes():
    with serve_app(create_sim_app(FAST)) as url, httpx.Client(base_url=url) as client:
        events = stream_chat(client, {"model": "m", "messages": USER, "n": 2, "max_tokens": 4})
    indexes = [e["choices"][0]["index"] for e in events[:-1]]
    assert indexes == [0, 1] * 6  # role, 4 tokens, finish: each for both choices in turn
    texts = ["".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"][0]["index"] == i)
             for i in (0, 1)]  # fmt: skip
    assert texts[0] != texts[1]


def test_unknown_model_gets_404_model_not_found_when_models_are_listed():
    options = dataclasses.replace(FAST, models=("glm-5.1",))
    with serve_app(create_sim_app(options)) as url:
        missing = httpx.post(url + "/v1/chat/completions", json={"model": "gpt-4o", "messages": USER})
        served = httpx.post(url + "/v1/chat/completions", json={"model": "glm-5.1", "messages": USER})
        listed = httpx.get(url + "/v1/models").json()
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert missing.json()["error"]["type"] == "invalid_request_error"
    assert served.status_code == 200
    assert listed == {
        "object": "list",
        "data": [
            {
                "id": "glm-5.1",
                "object": "model",
                "created": listed["data"][0]["created"],
                "owned_by": "latgate-sim",
            }
        ],
    }


def test_any_model_name_is_accepted_and_echoed_when_none_are_listed():
    with serve_app(create_sim_app(FAST)) as url:
        reply = httpx.post(
            url + "/chat/completions", json={"model": "anything/at-all", "messages": USER}
        ).json()
    assert reply["model"] == "anything/at-all"


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b"{not json", None),
        (b'["a list"]', None),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 99}', "n"),
    ],
)
def test_malformed_request_gets_400_in_the_openai_envelope(content, param):
    with serve_app(create_sim_app(FAST)) as url:
        response = httpx.post(url + "/v1/chat/completions", content=content)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


def test_health_models_and_unknown_paths_are_served_with_and_without_v1():
    with serve_app(create_sim_app(FAST)) as url:
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/models").json()["data"][0]["id"] == "sim-model"
        assert httpx.get(url + "/v1/models").json()["object"] == "list"
        unknown = httpx.get(url + "/v1/nothing-here")
        wrong_method = httpx.get(url + "/v1/chat/completions")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405


def test_completions_stream_text_completion_chunks():
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 3, "stream": True}
    with serve_app(create_sim_app(FAST)) as url, httpx.Client(base_url=url) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            events = sse_events(response)
        plain = client.post("/completions", json={**body, "stream": False}).json()
    *tokens, finish, done = events
    assert [e["object"] for e in tokens] == ["text_completion"] * 3
    assert "".join(e["choices"][0]["text"] for e in tokens) == plain["choices"][0]["text"]
    assert finish["choices"][0]["finish_reason"] == "length"
    assert done == "[DONE]"
    assert plain["usage"]["completion_tokens"] == 3


def test_openai_client_reads_streams_and_embeddings():
    with serve_app(create_sim_app(FAST)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sim", max_retries=0)
        stream = client.chat.completions.create(
            model="m", messages=USER, max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        vectors = client.embeddings.create(model="m", input=["alpha", "beta"])  # base64 on the wire
        again = httpx.post(
            url + "/v1/embeddings", json={"model": "m", "input": "alpha", "dimensions": 16}
        ).json()
    assert chunks[-1].usage.completion_tokens == 4
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 16
    assert vectors.data[0].embedding == pytest.approx(again["data"][0]["embedding"], rel=1e-6)
    assert sum(v * v for v in again["data"][0]["embedding"]) == pytest.approx(1.0)
    assert vectors.data[0].embedding != vectors.data[1].embedding


def test_embeddings_base64_is_little_endian_float32():
    with serve_app(create_sim_app(FAST)) as url:
        body = {"input": "x", "dimensions": 4}
        floats = httpx.post(url + "/embeddings", json=body).json()["data"][0]["embedding"]
        encoded = httpx.post(url + "/embeddings", json={**body, "encoding_format": "base64"}).json()
    decoded = struct.unpack("<4f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert decoded == pytest.approx(floats, rel=1e-6)


# -- tool calls ------------------------------------------------------------------------


def test_tool_call_streams_in_fragments_then_text_answers_the_tool_result():
    tools = [WEATHER_TOOL, SEARCH_TOOL]
    with serve_app(create_sim_app(FAST)) as url, httpx.Client(base_url=url) as client:
        first = stream_chat(client, {"model": "m", "messages": USER, "tools": tools})
        deltas = [e["choices"][0]["delta"] for e in first[1:-2]]
        header, *fragments = [d["tool_calls"][0] for d in deltas]
        assert header["index"] == 0 and header["type"] == "function" and header["id"].startswith("call_")
        assert header["function"] == {"name": "get_weather", "arguments": ""}
        assert len(fragments) >= 3
        assert all(set(f) == {"index", "function"} and set(f["function"]) == {"arguments"} for f in fragments)
        assert first[-2]["choices"][0]["finish_reason"] == "tool_calls"
        arguments = "".join(f["function"]["arguments"] for f in fragments)
        jsonschema.validate(orjson.loads(arguments), WEATHER_TOOL["function"]["parameters"])
        assert orjson.loads(arguments)["unit"] == "celsius"

        call = {
            "id": header["id"],
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }
        messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": header["id"], "content": "sunny, 21 C"}]  # fmt: skip
        second = stream_chat(client, {"model": "m", "messages": messages, "tools": tools})
    assert all("tool_calls" not in e["choices"][0]["delta"] for e in second[:-1])
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in second[:-1])
    assert second[-2]["choices"][0]["finish_reason"] == "stop"


def test_tool_choice_names_the_function_called_in_a_non_stream_reply():
    body = {
        "model": "m",
        "messages": USER,
        "tools": [WEATHER_TOOL, SEARCH_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "search"}},
    }
    with serve_app(create_sim_app(FAST)) as url:
        reply = httpx.post(url + "/v1/chat/completions", json=body).json()
        unknown = httpx.post(
            url + "/v1/chat/completions", json={**body, "tool_choice": {"function": {"name": "nope"}}}
        )
        declined = httpx.post(url + "/v1/chat/completions", json={**body, "tool_choice": "none"}).json()
    message = reply["choices"][0]["message"]
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] is None
    assert message["tool_calls"][0]["function"]["name"] == "search"
    assert orjson.loads(message["tool_calls"][0]["function"]["arguments"]) == {"query": "query"}
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "tool_choice"
    assert (
        declined["choices"][0]["message"]["content"] and "tool_calls" not in declined["choices"][0]["message"]
    )


def test_arguments_satisfy_required_fields_of_nested_and_combined_schemas():
    schema = {
        "type": "object",
        "properties": {
            "mode": {"anyOf": [{"type": "null"}, {"type": "string", "enum": ["fast", "slow"]}]},
            "limit": {"type": ["integer", "null"], "exclusiveMinimum": 0},
            "name": {"type": "string", "minLength": 12},
            "tags": {"type": "array", "items": {"type": "string"}},
            "flag": {"type": "boolean", "default": False},
            "kind": {"const": "file"},
        },
        "required": ["mode", "limit", "name", "tags", "flag", "kind"],
    }
    arguments = arguments_for(schema)
    jsonschema.validate(arguments, schema)
    assert arguments["mode"] == "fast" and arguments["flag"] is False
    assert arguments_for({"type": "object", "properties": {"x": {"type": "string"}}}) == {}


# -- timing model on virtual time ------------------------------------------------------


class Exchange:
    """One in-memory ASGI request: what the app sent, each message stamped with virtual time."""

    def __init__(self, app, clock: VirtualClock, method: str, path: str, body: dict[str, Any] | None) -> None:
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self._clock = clock
        self._body = orjson.dumps(body) if body is not None else b""
        self._sent_body = False
        self._gone = asyncio.Event()
        scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        self.messages.append((self._clock.now(), message))

    def disconnect(self) -> None:
        self._gone.set()

    @property
    def first_body_at(self) -> float:
        return next(t for t, m in self.messages if m["type"] == "http.response.body" and m["body"])

    @property
    def finished_at(self) -> float:
        return self.messages[-1][0]

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for _, m in self.messages)


def chat_body(
    content: str, *, max_tokens: int = 4, history: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    messages = [*(history or []), {"role": "user", "content": content}]
    return {"model": "m", "messages": messages, "max_tokens": max_tokens, "stream": True}


TIMED = SimOptions(
    prefill_tokens_per_second=1000.0, ttft_overhead_ms=5.0, tpot_ms=10.0, tpot_growth_ms=0.5, max_batch_size=2
)


def test_batch_of_two_makes_the_third_and_fourth_requests_wait_their_turn():
    async def scenario():
        clock = VirtualClock()
        app = create_sim_app(TIMED, clock=clock)
        exchanges = [Exchange(app, clock, "POST", "/v1/chat/completions", chat_body("hi")) for _ in range(4)]
        await clock.settle()
        assert (app.engine.running, app.engine.waiting) == (2, 2)
        metrics = Exchange(app, clock, "GET", "/metrics", None)
        await clock.settle()
        await clock.run_until_idle()
        await asyncio.gather(*(e.task for e in [*exchanges, metrics]))
        return app, exchanges, metrics

    app, exchanges, metrics = asyncio.run(scenario())
    prefill = 0.005 + estimate_prompt_tokens(chat_body("hi")) / 1000.0
    decode = 3 * (0.010 + 0.0005)  # three more tokens with two requests running
    assert [e.first_body_at for e in exchanges] == pytest.approx(
        [prefill, prefill, 2 * prefill + decode, 2 * prefill + decode]
    )
    assert [e.finished_at for e in exchanges] == pytest.approx(
        [prefill + decode] * 2 + [2 * (prefill + decode)] * 2
    )
    assert (app.engine.running, app.engine.waiting) == (0, 0)
    assert b'vllm:num_requests_running{model_name="sim"} 2.0' in metrics.body
    assert b'vllm:num_requests_waiting{model_name="sim"} 2.0' in metrics.body
    assert app.state.sim.completed == 4 and app.state.sim.in_flight == 0


def test_time_per_token_grows_with_the_running_batch():
    async def finish_time(concurrent: int) -> float:
        clock = VirtualClock()
        app = create_sim_app(dataclasses.replace(TIMED, max_batch_size=8, ttft_overhead_ms=0.0), clock=clock)
        exchanges = [Exchange(app, clock, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 11, "stream": True})
                     for _ in range(concurrent)]  # fmt: skip
        await clock.run_until_idle()
        await asyncio.gather(*(e.task for e in exchanges))
        return exchanges[0].finished_at - exchanges[0].first_body_at

    assert asyncio.run(finish_time(1)) == pytest.approx(10 * 0.010)
    assert asyncio.run(finish_time(5)) == pytest.approx(10 * (0.010 + 4 * 0.0005))


def test_prefix_cache_makes_a_repeated_prefix_cheaper_to_prefill():
    system = {"role": "system", "content": "You are a coding agent. " * 400}
    first = chat_body("list the files", history=[system])
    follow_up = chat_body(
        "now read main.py", history=[*first["messages"], {"role": "assistant", "content": "done"}]
    )

    async def ttfts(prefix_cache: bool) -> tuple[float, float]:
        clock = VirtualClock()
        app = create_sim_app(dataclasses.replace(TIMED, prefix_cache=prefix_cache), clock=clock)
        times = []
        for body in (first, follow_up):
            start = clock.now()
            exchange = Exchange(app, clock, "POST", "/v1/chat/completions", body)
            await clock.run_until_idle()
            await exchange.task
            times.append(exchange.first_body_at - start)
        return times[0], times[1]

    cold_first, cold_follow_up = asyncio.run(ttfts(False))
    warm_first, warm_follow_up = asyncio.run(ttfts(True))
    assert warm_first == pytest.approx(cold_first)  # nothing cached yet
    assert cold_follow_up == pytest.approx(0.005 + estimate_prompt_tokens(follow_up) / 1000.0)
    assert warm_follow_up < 0.1 * cold_follow_up


def test_stall_pauses_mid_stream_for_stall_ms():
    async def duration(stall_rate: float) -> tuple[float, float]:
        clock = VirtualClock()
        options = dataclasses.replace(TIMED, stall_rate=stall_rate, stall_ms=500.0, seed=3)
        exchange = Exchange(
            create_sim_app(options, clock=clock), clock, "POST", "/v1/chat/completions", chat_body("x")
        )
        await clock.run_until_idle()
        await exchange.task
        return exchange.first_body_at, exchange.finished_at

    smooth_first, smooth_end = asyncio.run(duration(0.0))
    stalled_first, stalled_end = asyncio.run(duration(1.0))
    assert stalled_first == pytest.approx(smooth_first)
    assert stalled_end - smooth_end == pytest.approx(0.5)


def test_a_waiting_request_that_leaves_gives_its_turn_to_the_next():
    async def scenario():
        clock = VirtualClock()
        app = create_sim_app(dataclasses.replace(TIMED, max_batch_size=1), clock=clock)
        running, leaving, next_in_line = (
            Exchange(app, clock, "POST", "/v1/chat/completions", chat_body("hi")) for _ in range(3)
        )
        await clock.settle()
        assert app.engine.waiting == 2
        leaving.disconnect()
        await clock.settle()
        assert app.engine.waiting == 1 and app.state.sim.disconnects == 1
        await clock.run_until_idle()
        await asyncio.gather(running.task, leaving.task, next_in_line.task)
        return app, running, leaving, next_in_line

    app, _, leaving, next_in_line = asyncio.run(scenario())
    assert not any(m["type"] == "http.response.body" for _, m in leaving.messages)
    assert next_in_line.body.endswith(b"data: [DONE]\n\n")
    assert (app.engine.running, app.engine.waiting, app.state.sim.completed) == (0, 0, 2)


# -- faults ----------------------------------------------------------------------------


def test_faults_are_the_same_under_the_same_seed():
    options = dataclasses.replace(FAST, rate_limit_rate=0.3, error_rate=0.2, retry_after_seconds=2, seed=42)

    def statuses() -> list[tuple[int, str | None]]:
        with serve_app(create_sim_app(options)) as url, httpx.Client(base_url=url) as client:
            responses = [client.post("/v1/chat/completions", json={"messages": USER}) for _ in range(20)]
        return [(r.status_code, r.headers.get("retry-after")) for r in responses]

    first, second = statuses(), statuses()
    assert first == second
    assert {status for status, _ in first} == {200, 429, 500}
    assert all(retry == "2" for status, retry in first if status == 429)


def test_error_and_rate_limit_faults_use_the_openai_envelope():
    with serve_app(create_sim_app(dataclasses.replace(FAST, error_rate=1.0))) as url:
        failed = httpx.post(url + "/v1/chat/completions", json={"messages": USER})
    with serve_app(create_sim_app(dataclasses.replace(FAST, rate_limit_rate=1.0))) as url:
        limited = httpx.post(url + "/v1/chat/completions", json={"messages": USER})
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "api_error"
    assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limit_error"
    assert limited.headers["retry-after"] == "1"


def test_dropped_stream_closes_the_connection_without_done():
    app = create_sim_app(dataclasses.replace(FAST, drop_rate=1.0, seed=7, default_max_tokens=20))
    lines = []
    with serve_app(app) as url, httpx.Client(base_url=url) as client:
        with (
            pytest.raises(httpx.RemoteProtocolError),
            client.stream(
                "POST", "/v1/chat/completions", json={"messages": USER, "stream": True}
            ) as response,
        ):
            lines.extend(response.iter_lines())
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/v1/chat/completions", json={"messages": USER})
    assert any('"content":"' in line for line in lines)
    assert "data: [DONE]" not in lines
    assert app.state.sim.drops == 2 and app.state.sim.completed == 0


# -- load gauges and disconnects over real HTTP ---------------------------------------


def test_metrics_report_running_and_waiting_requests():
    options = dataclasses.replace(FAST, max_batch_size=1, ttft_overhead_ms=60_000.0, models=("m",))
    app = create_sim_app(options)
    body = {"model": "m", "messages": USER, "stream": True}
    with serve_app(app) as url, httpx.Client(base_url=url) as client:
        # Headers arrive once the request is in the engine, running or queued.
        with (
            client.stream("POST", "/v1/chat/completions", json=body),
            client.stream("POST", "/v1/chat/completions", json=body),
        ):
            metrics = client.get("/metrics").text
        assert app.state.sim.disconnected_event.wait(5)
    assert 'vllm:num_requests_running{model_name="m"} 1.0' in metrics
    assert 'vllm:num_requests_waiting{model_name="m"} 1.0' in metrics
    assert 'sglang:num_queue_reqs{model_name="m"} 1.0' in metrics
    assert "latgate_sim_requests_total 2.0" in metrics


def test_client_disconnect_mid_stream_stops_generation_at_once():
    app = create_sim_app(dataclasses.replace(FAST, tpot_ms=20.0, default_max_tokens=500))
    with serve_app(app) as url, httpx.Client(base_url=url) as client:
        with client.stream(
            "POST", "/v1/chat/completions", json={"messages": USER, "stream": True}
        ) as response:
            for line in response.iter_lines():
                if '"content":"' in line and '"role"' not in line:
                    break
        assert app.state.sim.disconnected_event.wait(5)
    stats = app.state.sim
    assert (stats.disconnects, stats.in_flight, stats.completed) == (1, 0, 0)
    assert (app.engine.running, app.engine.waiting) == (0, 0)
    assert stats.last_request.body["stream"] is True


# -- profiles and command line ---------------------------------------------------------


def provider(name: str, **fields: Any) -> ProviderConfig:
    endpoint = EndpointConfig(id=f"{name}-0", api_base=fields.pop("api_base", "https://api.example.com/v1"))
    return ProviderConfig(name=name, endpoints=(endpoint,), **fields)


def test_profiles_make_the_decode_pool_fast_and_the_upstream_slow_to_start():
    decode = profile_for(provider("tile-rt", engine="tile-rt", connector="tile_rt_connector", max_batch_size=8,
                                  enable_prefix_cache=True, models=("glm-5.1",)))  # fmt: skip
    throughput = profile_for(provider("vllm", engine="vllm", api_base="http://127.0.0.1:9102/v1"))
    local_sglang = profile_for(provider("sglang_local", api_base="http://127.0.0.1:30000/v1"))
    upstream = profile_for(provider("taotoken", api_base="https://taotoken.net/api"))
    assert decode.profile == "tilert" and decode.tpot_ms <= 3 and decode.decode_nodes == 8
    assert decode.models == ("glm-5.1",) and decode.name == "tile-rt"
    openai_decode = profile_for(provider("fast", role="decode", max_batch_size=8, enable_prefix_cache=True))
    assert openai_decode.profile == "openai" and openai_decode.tpot_ms <= 2 and openai_decode.prefix_cache
    assert throughput.tpot_ms >= 20 and throughput.max_batch_size > 8 and throughput.prefix_cache  # caches, as vLLM does by default
    assert not decode.prefix_cache  # TileRT's decode nodes keep no prefix cache
    uncached = profile_for(provider("vllm", engine="vllm", api_base="http://127.0.0.1:9102/v1", enable_prefix_cache=False))
    assert not uncached.prefix_cache
    assert local_sglang.tpot_ms == throughput.tpot_ms
    assert upstream.ttft_overhead_ms >= 100 and 10 <= upstream.tpot_ms < throughput.tpot_ms


def test_argv_for_gives_flags_that_parse_back_to_the_same_options():
    import argparse

    options = SimOptions(name="pool", models=("a", "b"), tpot_ms=1.5, max_batch_size=8, prefix_cache=True,
                         drop_rate=0.25, seed=9)  # fmt: skip
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert options_from_args(parser.parse_args(["--port", "0", *argv_for(options)])) == options
    tilert = SimOptions(profile="tilert", name="tile-rt", decode_nodes=2, ttft_overhead_ms=20.0, tpot_ms=2.5,
                        prefill_tokens_per_second=20_000.0, tpot_growth_ms=0.0, decode_error_rate=0.5)  # fmt: skip
    argv = argv_for(tilert)
    assert argv[:2] == ["--profile", "tilert"] and "--tpot-ms" not in argv  # the profile's own defaults
    assert options_from_args(parser.parse_args(["--port", "0", *argv])) == tilert


def test_sim_help_exits_zero_and_bad_options_print_one_line():
    help_run = subprocess.run(
        [sys.executable, "-m", "latgate", "sim", "--help"], capture_output=True, text=True, check=False
    )
    bad = subprocess.run(
        [sys.executable, "-m", "latgate", "sim", "--port", "0", "--error-rate", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert help_run.returncode == 0 and "--tpot-ms" in help_run.stdout
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "latgate sim: error: error_rate must be between 0 and 1, got 2.0"
    ]


def test_openai_paths_are_served_behind_a_base_path_prefix() -> None:
    with serve_app(create_sim_app(SimOptions())) as url:
        r = httpx.post(url + "/api/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
