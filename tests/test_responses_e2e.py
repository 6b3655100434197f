"""``POST /v1/responses`` end to end: the openai SDK's Responses client through latgate to
simulated providers (chat completions)."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest
from completions import DONE, ROLE, chat_chunk, content, event
from replay import ReplayScript
from stack import FAST, demo_stack, replay_gateway

from latgate.commands.sim import SimOptions

SHELL = {
    "type": "function",
    "name": "shell",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "strict": False,
}


@pytest.fixture(scope="module")
def client(demo) -> openai.OpenAI:
    return openai.OpenAI(base_url=demo.v1, api_key="sk-test", max_retries=0)


def test_non_streamed_response_has_text_usage_and_is_measured_under_its_provider(demo, client) -> None:
    raw = client.responses.with_raw_response.create(
        model="glm-5.1", input="hello", instructions="be brief", store=False
    )
    response = raw.parse()
    assert raw.headers["x-latgate-provider"] == "vllm"
    assert response.status == "completed" and response.output_text
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    sent = demo.sims["vllm"].stats.last_request.body
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert (
        'latgate_requests_total{code="200",model="glm-5.1",provider="vllm"}'
        in httpx.get(demo.url + "/metrics").text
    )


def test_streamed_tool_call_round_trip_completes(demo, client) -> None:
    with client.responses.stream(model="glm-5.1", input="list files", tools=[SHELL], store=False) as events:
        types = [event.type for event in events]
        first = events.get_final_response()
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "shell"
    assert orjson.loads(call.arguments) == {"command": "command"}

    history = [
        {"role": "user", "content": "list files"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"},
    ]
    with client.responses.stream(model="glm-5.1", input=history, tools=[SHELL], store=False) as events:
        second = events.get_final_response()
    assert second.output_text and second.output[0].type == "message"
    sent = demo.sims["vllm"].stats.last_request.body["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "a.txt"}


def test_latency_sensitive_alias_routes_a_responses_request_to_the_decode_pool(demo) -> None:
    r = httpx.post(
        demo.url + "/responses", json={"model": "glm-5.1-highspeed", "input": "hi", "store": False}
    )
    assert r.status_code == 200
    assert r.headers["x-latgate-provider"] == "tile-rt"
    assert r.json()["model"] == "glm-5.1-highspeed"


def test_store_true_is_a_400_naming_the_field(client) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="glm-5.1", input="hi", store=True)
    assert raised.value.body["param"] == "store"


def test_previous_response_id_is_a_400_naming_the_field(client) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="glm-5.1", input="hi", previous_response_id="resp_123", store=False)
    assert raised.value.body["param"] == "previous_response_id"


def test_provider_dying_mid_stream_ends_with_response_failed() -> None:
    dying = SimOptions(name="vllm", drop_rate=1.0, seed=3, **{**FAST, "default_max_tokens": 40})
    with (
        demo_stack(vllm=dying, max_retries=0) as stack,
        httpx.stream(
            "POST", stack.v1 + "/responses", json={"model": "glm-5.1", "input": "hi", "stream": True}
        ) as r,
    ):
        data = r.read()
    events = [orjson.loads(block.split(b"data: ", 1)[1]) for block in data.split(b"\n\n") if block]
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.failed"
    assert "failed mid-stream" in events[-1]["response"]["error"]["message"]


def test_a_finish_reason_that_is_not_a_string_gives_a_completed_response_not_a_500() -> None:
    # an upstream's malformed finish_reason (a list does not hash) was a 500 from the
    # Responses translation; it is read as no finish reason, as other malformed members are
    whole = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": ["length"]}],
    }
    with replay_gateway(ReplayScript.json_response(200, whole)) as (_, gw):
        r = httpx.post(gw.url + "/v1/responses", json={"model": "m", "input": "hello", "store": False})
    assert r.status_code == 200
    answer = r.json()
    assert answer["status"] == "completed" and answer["incomplete_details"] is None
    assert answer["output"][0]["content"][0]["text"] == "hi"


def test_a_streamed_finish_reason_that_is_not_a_string_still_completes_the_response() -> None:
    stream = ROLE + content("hi") + event(chat_chunk({}, finish_reason=["length"])) + DONE
    body = {"model": "m", "input": "hello", "store": False, "stream": True}
    with replay_gateway(ReplayScript.sse(stream)) as (_, gw), httpx.stream("POST", gw.url + "/v1/responses", json=body) as r:
        events = [orjson.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["incomplete_details"] is None


def test_an_answer_cut_at_max_output_tokens_is_incomplete_in_the_response_and_its_message(client) -> None:
    """The Responses reference gives an output message ``status`` of ``in_progress``,
    ``completed`` or ``incomplete``: the message a ``max_output_tokens`` cut interrupted
    is ``incomplete``, in the non-streamed body, in its ``output_item.done`` and in the
    ``response.incomplete`` snapshot alike."""
    response = client.responses.create(model="glm-5.1", input="hello", max_output_tokens=3, store=False)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    (message,) = response.output
    assert message.type == "message" and message.status == "incomplete"

    with client.responses.stream(model="glm-5.1", input="hello", max_output_tokens=3, store=False) as stream:
        events = list(stream)
    (done,) = [e for e in events if e.type == "response.output_item.done"]
    assert done.item.type == "message" and done.item.status == "incomplete"
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert [item.status for item in events[-1].response.output] == ["incomplete"]
    # as docs/clients.md says: the SDK's final-response helper wants response.completed
    with (
        client.responses.stream(model="glm-5.1", input="hello", max_output_tokens=3, store=False) as stream,
        pytest.raises(RuntimeError, match="response.completed"),
    ):
        stream.get_final_response()


def test_a_cut_answer_leaves_the_items_finished_before_the_cut_completed() -> None:
    """Reasoning that ended before the text began is whole; only the text was cut."""
    stream = (
        ROLE
        + event(chat_chunk({"reasoning_content": "think"}))
        + content("partial")
        + event(chat_chunk({}, finish_reason="length"))
        + DONE
    )
    whole = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "reasoning_content": "think", "content": "partial"},
                "finish_reason": "length",
            }
        ],
    }
    with replay_gateway([ReplayScript.sse(stream), ReplayScript.json_response(200, whole)]) as (_, gw):
        sdk = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
        with sdk.responses.stream(model="m", input="hello", store=False) as stream:
            events = list(stream)
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert events[-1].type == "response.incomplete"
        final = events[-1].response
        answer = sdk.responses.create(model="m", input="hello", store=False)
    expected = [("reasoning", "completed"), ("message", "incomplete")]
    assert [(item.type, item.status) for item in done] == expected
    assert [(item.type, item.status) for item in final.output] == expected and final.status == "incomplete"
    assert [(item.type, item.status) for item in answer.output] == expected and answer.status == "incomplete"
