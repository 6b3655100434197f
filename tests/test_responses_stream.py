"""Chat completions stream/answer -> Responses API events/object
(latgate.request.translate.responses_stream, responses_output), checked against the official
OpenAI API description."""

from __future__ import annotations

import orjson
import pytest
from completions import DONE, chat_chunk, event
from openapi import validate

from latgate.forwarding.transform import UntranslatableAnswer
from latgate.request.translate.responses_request import responses_to_chat
from latgate.request.translate.responses_stream import ResponsesStreamTransform

SCHEMAS = {
    "response.created": "ResponseCreatedEvent",
    "response.in_progress": "ResponseInProgressEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent",
    "response.output_text.done": "ResponseTextDoneEvent",
    "response.refusal.delta": "ResponseRefusalDeltaEvent",
    "response.refusal.done": "ResponseRefusalDoneEvent",
    "response.reasoning_text.delta": "ResponseReasoningTextDeltaEvent",
    "response.reasoning_text.done": "ResponseReasoningTextDoneEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
    "response.completed": "ResponseCompletedEvent",
    "response.incomplete": "ResponseIncompleteEvent",
    "response.failed": "ResponseFailedEvent",
}
USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 5,
    "total_tokens": 35,
    "prompt_tokens_details": {"cached_tokens": 16},
}


def _transform(**request) -> ResponsesStreamTransform:
    echo = responses_to_chat({"model": "glm-5.1", "input": "hi", "stream": True, **request}).echo
    return ResponsesStreamTransform(echo=echo, clock=lambda: 1_700_000_000.0)


def _chunk(delta: dict | None = None, *, finish: str | None = None, usage: dict | None = None) -> bytes:
    return event(chat_chunk(delta, finish_reason=finish, usage=usage, model="glm-5.1"))


def _events(data: bytes) -> list[dict]:
    events = []
    for block in data.split(b"\n\n"):
        if not block:
            continue
        event_line, data_line = block.split(b"\n")
        event = orjson.loads(data_line.removeprefix(b"data: "))
        assert event_line == b"event: " + event["type"].encode()
        events.append(event)
    return events


def _run(transform: ResponsesStreamTransform, chunks: list[bytes], *, error: str | None = None) -> list[dict]:
    out = b"".join(transform.feed(chunk) for chunk in chunks) + transform.finish(error=error)
    events = _events(out)
    for sent in events:
        validate(sent, SCHEMAS[sent["type"]])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


TEXT = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Hel"}), _chunk({"content": "lo"})]
TEXT_END = [_chunk({}, finish="stop"), _chunk(usage=USAGE), DONE]


def test_text_stream_emits_the_documented_event_sequence() -> None:
    events = _run(_transform(), TEXT + TEXT_END)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["Hel", "lo"]
    response = events[-1]["response"]
    validate(response, "Response")
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0]["text"] == "Hello"
    assert response["usage"]["input_tokens"] == 30
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 16
    assert response["usage"]["output_tokens"] == 5
    assert response["id"] == events[0]["response"]["id"]


def test_any_split_of_the_stream_into_reads_gives_the_same_events() -> None:
    whole = _run(_transform(), [b"".join(TEXT + TEXT_END)])
    one_by_one = _run(_transform(), TEXT + TEXT_END)
    assert [(e["type"], e.get("delta")) for e in whole] == [(e["type"], e.get("delta")) for e in one_by_one]


def test_parallel_tool_calls_become_function_call_items_with_their_arguments() -> None:
    def call(
        index: int, *, call_id: str | None = None, name: str | None = None, arguments: str = ""
    ) -> bytes:
        function = {"arguments": arguments} | ({"name": name} if name else {})
        fragment = {"index": index, "function": function} | (
            {"id": call_id, "type": "function"} if call_id else {}
        )
        return _chunk({"tool_calls": [fragment]})

    chunks = [
        call(0, call_id="call_a", name="shell", arguments=""),
        call(0, arguments='{"command":'),
        call(1, call_id="call_b", name="read", arguments='{"path":"a"}'),
        call(0, arguments='"ls"}'),
        _chunk({}, finish="tool_calls"),
    ]
    events = _run(
        _transform(tools=[{"type": "function", "name": "shell", "parameters": {}, "strict": None}]), chunks
    )
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["name"], e["arguments"], e["output_index"]) for e in done] == [
        ("shell", '{"command":"ls"}', 0),
        ("read", '{"path":"a"}', 1),
    ]
    output = events[-1]["response"]["output"]
    assert [(item["type"], item["call_id"], item["status"]) for item in output] == [
        ("function_call", "call_a", "completed"),
        ("function_call", "call_b", "completed"),
    ]


def test_reasoning_then_text_become_two_output_items_in_order() -> None:
    chunks = [
        _chunk({"reasoning_content": "think"}),
        _chunk({"content": "answer"}),
        _chunk({}, finish="stop"),
    ]
    events = _run(_transform(), chunks)
    kinds = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    assert kinds == ["reasoning", "message"]
    assert events[-1]["response"]["output"][0]["content"] == [{"type": "reasoning_text", "text": "think"}]


def test_refusal_is_a_refusal_part() -> None:
    events = _run(_transform(), [_chunk({"refusal": "no"}), _chunk({}, finish="stop")])
    assert events[-1]["response"]["output"][0]["content"] == [{"type": "refusal", "refusal": "no"}]


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_a_cut_answer_ends_with_response_incomplete(finish: str, reason: str) -> None:
    events = _run(_transform(), [*TEXT, _chunk({}, finish=finish)])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": reason}


def test_a_text_then_tool_call_cut_by_length_leaves_the_call_incomplete() -> None:
    """Tool calls stay open to the end, so a cut interrupts them, not the text before."""
    call = {"index": 0, "id": "call_1", "function": {"name": "shell", "arguments": '{"comm'}}
    events = _run(_transform(), [*TEXT, _chunk({"tool_calls": [call]}), _chunk({}, finish="length")])
    done = [(e["item"]["type"], e["item"]["status"]) for e in events if e["type"] == "response.output_item.done"]
    assert done == [("message", "completed"), ("function_call", "incomplete")]
    assert [(i["type"], i["status"]) for i in events[-1]["response"]["output"]] == done


def test_an_upstream_failure_mid_stream_ends_with_response_failed() -> None:
    events = _run(_transform(), TEXT, error="provider 'vllm' failed mid-stream")
    assert events[-2]["type"] == "response.output_item.done"
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {
        "code": "server_error",
        "message": "provider 'vllm' failed mid-stream",
    }


def test_an_in_band_error_event_ends_with_response_failed_and_nothing_after() -> None:
    error = b'data: {"error": {"message": "engine overloaded", "type": "api_error"}}\n\n'
    events = _run(_transform(), [*TEXT, error, _chunk({"content": "late"})])
    assert events[-1]["type"] == "response.failed"
    assert "late" not in [e.get("delta") for e in events]


def test_a_stream_that_ends_before_any_event_still_opens_and_completes_the_response() -> None:
    events = _run(_transform(), [])
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]


def test_a_whole_answer_becomes_a_response_object() -> None:
    chat = {
        "id": "c1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "glm-5.1",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Running it.",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
                    ],
                },
            }
        ],
        "usage": USAGE,
    }
    response = orjson.loads(_transform(instructions="be brief").complete(orjson.dumps(chat)))
    validate(response, "Response")
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["output"][1]["call_id"] == "call_1"
    assert (response["status"], response["instructions"], response["store"]) == (
        "completed",
        "be brief",
        False,
    )
    assert response["usage"]["total_tokens"] == 35


def test_a_body_that_is_not_a_chat_completion_is_untranslatable() -> None:
    with pytest.raises(UntranslatableAnswer):  # the provider's failure (502), never relayed raw
        _transform().complete(b"not json")


def test_a_call_to_a_flattened_namespace_function_gets_its_namespace_back() -> None:
    echo = responses_to_chat({"model": "glm-5.1", "input": "hi"}).echo
    transform = ResponsesStreamTransform(echo=echo, namespaced={"ns__spawn": ("ns", "spawn")})
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "ns__spawn", "arguments": "{}"},
    }
    events = _run(transform, [_chunk({"tool_calls": [call]}), _chunk({}, finish="tool_calls")])
    (item,) = events[-1]["response"]["output"]
    assert (item["namespace"], item["name"]) == ("ns", "spawn")
    assert [e["name"] for e in events if e["type"] == "response.function_call_arguments.done"] == ["spawn"]


@pytest.mark.parametrize(
    "chunk",
    [
        {"choices": [{"index": 0, "delta": "x"}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]},
    ],
    ids=["delta-not-object", "function-not-object"],
)
def test_a_malformed_chunk_is_skipped_and_the_rest_still_translated(chunk: dict) -> None:
    transform = _transform()
    out = transform.feed(event(chunk) + event(chat_chunk({"content": "after"})))
    out += transform.finish(error=None)
    assert b"response.completed" in out and b'"delta":"after"' in out
