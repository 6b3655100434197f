"""Anthropic Messages <-> chat completions translation, on plain data (no servers)."""

from __future__ import annotations

import json

import orjson
import pytest
from completions import chat_chunk, event, usage

from latgate.forwarding.exchange import Exchange
from latgate.forwarding.transform import UntranslatableAnswer
from latgate.foundation.errors import InvalidRequest
from latgate.request.translate import MessagesStream, chat_to_message, messages_to_chat

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "cache_control": {"type": "ephemeral"},
}


def exchange() -> Exchange:
    return Exchange(
        request_id="r",
        received_at=0.0,
        path="/messages",
        stream=True,
        public_model="claude-sonnet-4-5",
        prompt_tokens=42,
    )


def chunk(delta: dict | None = None, *, finish: str | None = None, **choice) -> bytes:
    return event(chat_chunk(delta or {}, finish_reason=finish, **choice))


def usage_chunk(prompt: int, completion: int, cached: int = 0) -> bytes:
    numbers = usage(prompt, completion)
    if cached:
        numbers["prompt_tokens_details"] = {"cached_tokens": cached}
    return event(chat_chunk(usage=numbers))


def events(raw: bytes) -> list[tuple[str, dict]]:
    """``[(event name, data)]`` of an Anthropic SSE stream."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        out.append((lines["event"], data))
    return out


def run_stream(
    *pieces: bytes, stop_sequences: tuple[str, ...] = (), error: str | None = None
) -> list[tuple[str, dict]]:
    transform = MessagesStream(exchange=exchange(), stop_sequences=stop_sequences)
    raw = b"".join(transform.feed(piece) for piece in pieces) + transform.finish(error=error)
    return events(raw)


def assembled(stream: list[tuple[str, dict]]) -> list[dict]:
    """Content blocks rebuilt from the events, as an SDK would."""
    blocks: dict[int, dict] = {}
    for name, data in stream:
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"], _json="")
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                block["_json"] += delta["partial_json"]
    out = []
    for index in sorted(blocks):
        block = blocks[index]
        raw = block.pop("_json")
        if block["type"] == "tool_use":
            block["input"] = json.loads(raw) if raw else {}
        out.append(block)
    return out


# -- requests -------------------------------------------------------------------------


def test_system_blocks_and_text_only_user_blocks_become_strings() -> None:
    chat = messages_to_chat(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 100,
            "system": [
                {"type": "text", "text": "You are Claude Code."},
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "hi"}],
                }
            ],
        }
    )
    assert chat == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "messages": [
            {"role": "system", "content": "You are Claude Code.\nBe brief."},
            {"role": "user", "content": "<reminder>\nhi"},
        ],
    }


def test_claude_code_only_fields_are_dropped_and_the_rest_mapped() -> None:
    chat = messages_to_chat(
        {
            "model": "claude-opus-4-1",
            "max_tokens": 32000,
            "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": 4000},
            "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            "output_config": {"effort": "high"},
            "metadata": {"user_id": "user_abc_session_1"},
            "service_tier": "auto",
            "temperature": 1,
            "top_k": 5,
            "stop_sequences": ["</done>"],
            "stream": True,
            "tools": [WEATHER_TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        }
    )
    assert chat == {
        "model": "claude-opus-4-1",
        "max_tokens": 32000,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 1,
        "top_k": 5,
        "stop": ["</done>"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": WEATHER_TOOL["input_schema"],
                    "description": "Weather for a city",
                },
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "user": "user_abc_session_1",
    }


@pytest.mark.parametrize(
    ("anthropic", "openai"),
    [
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
    ],
)
def test_tool_choice_maps_to_its_chat_counterpart(anthropic: dict, openai: object) -> None:
    chat = messages_to_chat(
        {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER_TOOL], "tool_choice": anthropic}
    )
    assert chat["tool_choice"] == openai


def test_tool_choice_without_client_tools_is_not_sent() -> None:
    chat = messages_to_chat({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}})
    assert "tool_choice" not in chat and "tools" not in chat


def test_tool_use_round_trip_history_becomes_tool_calls_then_tool_messages() -> None:
    chat = messages_to_chat(
        {
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "I should call the tool", "signature": "sig"},
                        {"type": "text", "text": "Checking."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                        {
                            "type": "tool_use",
                            "id": "toolu_2",
                            "name": "get_weather",
                            "input": {"city": "Lyon"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": "18C",
                            "cache_control": {"type": "ephemeral"},
                        },
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "content": [{"type": "text", "text": "20C"}],
                            "is_error": False,
                        },
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ]
        }
    )
    assert chat["messages"] == [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Lyon"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "20C"},
        {"role": "user", "content": "thanks"},
    ]


def test_images_and_documents_become_content_parts() -> None:
    chat = messages_to_chat(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
                        {
                            "type": "document",
                            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
                            "title": "spec.pdf",
                        },
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "plain doc"},
                        },
                        {"type": "text", "text": "describe"},
                    ],
                }
            ]
        }
    )
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
        {
            "type": "file",
            "file": {"filename": "spec.pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
        },
        {"type": "text", "text": "plain doc"},
        {"type": "text", "text": "describe"},
    ]


def test_image_in_a_tool_result_follows_the_tool_message_as_user_content() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}}
    chat = messages_to_chat(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "screenshot", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "text", "text": "shot"}, image],
                        }
                    ],
                },
            ]
        }
    )
    assert chat["messages"][1:] == [
        {"role": "tool", "tool_call_id": "t", "content": "shot"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}}],
        },
    ]
    assert chat["messages"][0] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
        ],
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages.0.content.0.tool_use_id",
        ),
    ],
)
def test_malformed_requests_raise_invalid_request_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        messages_to_chat(body)
    assert caught.value.param == param


# -- whole responses ------------------------------------------------------------------


def completion(message: dict, finish: str | None, **choice_extra) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-xyz",
            "object": "chat.completion",
            "model": "glm-5.1",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice_extra}],
            "usage": {
                "prompt_tokens": 30,
                "completion_tokens": 7,
                "total_tokens": 37,
                "prompt_tokens_details": {"cached_tokens": 20},
            },
        }
    )


def test_completion_with_reasoning_text_and_tool_calls_becomes_a_message() -> None:
    body = completion(
        {
            "role": "assistant",
            "reasoning_content": "think",
            "content": "Calling.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        "tool_calls",
    )
    message = orjson.loads(
        chat_to_message(body, model="claude-sonnet-4-5", stop_sequences=(), estimated_input_tokens=1)
    )
    assert message == {
        "id": "msg_xyz",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "think", "signature": ""},
            {"type": "text", "text": "Calling."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 10,
            "output_tokens": 7,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 20,
        },
    }


@pytest.mark.parametrize(
    ("finish", "extra", "reason", "sequence"),
    [
        ("stop", {}, "end_turn", None),
        ("length", {}, "max_tokens", None),
        ("content_filter", {}, "refusal", None),
        ("stop", {"stop_reason": "</done>"}, "stop_sequence", "</done>"),  # vLLM names the match
        ("stop", {"matched_stop": "</done>"}, "stop_sequence", "</done>"),  # SGLang does too
        ("stop", {"stop_reason": 151645}, "end_turn", None),  # an EOS token id is not a stop sequence
        (None, {}, "end_turn", None),
        ("", {}, "end_turn", None),
    ],
)
def test_finish_reasons_map_to_stop_reasons(finish, extra, reason, sequence) -> None:
    body = completion({"role": "assistant", "content": "ok"}, finish, **extra)
    message = orjson.loads(
        chat_to_message(body, model="m", stop_sequences=("</done>",), estimated_input_tokens=1)
    )
    assert (message["stop_reason"], message["stop_sequence"]) == (reason, sequence)


def test_tool_calls_with_finish_reason_stop_are_still_tool_use() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}
    body = completion({"role": "assistant", "content": None, "tool_calls": [call]}, "stop")
    message = orjson.loads(chat_to_message(body, model="m", stop_sequences=(), estimated_input_tokens=1))
    assert message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "tool_use", "id": "c", "name": "f", "input": {"arguments": "not json"}}
    ]


def test_body_without_usage_reports_the_estimate_and_an_unparsable_body_is_untranslatable() -> None:
    body = orjson.dumps(
        {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            ]
        }
    )
    message = orjson.loads(chat_to_message(body, model="m", stop_sequences=(), estimated_input_tokens=17))
    assert message["usage"]["input_tokens"] == 17
    with pytest.raises(UntranslatableAnswer):  # the provider's failure (502), not an empty message
        chat_to_message(b"<html>", model="m", stop_sequences=(), estimated_input_tokens=1)


# -- streams --------------------------------------------------------------------------


def test_text_stream_follows_the_anthropic_event_sequence() -> None:
    stream = run_stream(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}) + chunk({"content": "lo"}),
        chunk({}, finish="stop"),
        usage_chunk(12, 2, cached=4),
        b"data: [DONE]\n\n",
    )
    assert [name for name, _ in stream] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = stream[0][1]["message"]
    assert (
        start["model"] == "claude-sonnet-4-5"
        and start["content"] == []
        and start["usage"]["input_tokens"] == 42
    )
    assert assembled(stream) == [{"type": "text", "text": "Hello"}]
    assert stream[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {
            "input_tokens": 8,
            "output_tokens": 2,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 4,
        },
    }


def test_reasoning_then_text_gives_a_thinking_block_then_a_text_block() -> None:
    stream = run_stream(
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Let me "}),
        chunk({"reasoning": "think."}),  # the other spelling (OpenRouter, newer vLLM)
        chunk({"content": "Answer"}),
        chunk({}, finish="stop"),
    )
    assert assembled(stream) == [
        {"type": "thinking", "thinking": "Let me think.", "signature": ""},
        {"type": "text", "text": "Answer"},
    ]
    deltas = [data["delta"]["type"] for name, data in stream if name == "content_block_delta"]
    assert deltas == ["thinking_delta", "thinking_delta", "text_delta"]


def test_parallel_tool_calls_become_consecutive_tool_use_blocks() -> None:
    stream = run_stream(
        chunk({"content": "Let me check."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": '{"tz": "CET"}'},
                    }
                ]
            }
        ),
        chunk({}, finish="tool_calls"),
    )
    assert assembled(stream) == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_b", "name": "get_time", "input": {"tz": "CET"}},
    ]
    starts_and_stops = [
        (name, data["index"])
        for name, data in stream
        if name in ("content_block_start", "content_block_stop")
    ]
    assert starts_and_stops == [
        ("content_block_start", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_stop", 2),
    ]
    assert stream[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_upstream_quirks_empty_finish_reason_empty_tool_calls_and_bare_continuations() -> None:
    stream = run_stream(
        chunk({"role": "assistant", "content": "Sure", "tool_calls": []}, finish=""),
        chunk({"content": ".", "tool_calls": None}, finish=""),
        chunk(
            {"tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file"}}]},
            finish="",
        ),
        chunk({"tool_calls": [{"function": {"arguments": '{"path":'}}]}, finish=""),  # no id, no index
        chunk({"tool_calls": [{"type": "function", "function": {"arguments": ' "a.py"}'}}]}),
        chunk({}, finish="stop"),  # an engine saying stop after a tool call
    )
    assert assembled(stream) == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a.py"}},
    ]
    assert stream[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_same_index_with_a_new_id_is_a_new_call_and_a_late_name_is_waited_for() -> None:
    stream = run_stream(
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "b", "function": {"arguments": '{"x":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"name": "g", "arguments": " 1}"}}]}),
    )
    assert assembled(stream) == [
        {"type": "tool_use", "id": "a", "name": "f", "input": {}},
        {"type": "tool_use", "id": "b", "name": "g", "input": {"x": 1}},
    ]


def test_stop_sequence_reported_by_the_engine_is_the_stop_sequence() -> None:
    stream = run_stream(
        chunk({"content": "done"}),
        chunk({}, finish="stop", stop_reason="</s2>"),
        stop_sequences=("</s1>", "</s2>"),
    )
    assert stream[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "</s2>"}


def test_stream_without_usage_counts_output_units_and_uses_the_estimate() -> None:
    stream = run_stream(chunk({"content": "a"}), chunk({"content": "b"}), chunk({}, finish="length"))
    assert stream[-2][1]["usage"]["output_tokens"] == 2
    assert stream[-2][1]["usage"]["input_tokens"] == 42
    assert stream[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_mid_stream_failure_ends_with_an_error_event_and_no_message_stop() -> None:
    stream = run_stream(chunk({"content": "partial"}), error="provider 'p' failed mid-stream")
    assert stream[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "provider 'p' failed mid-stream"}},
    )
    assert "message_stop" not in [name for name, _ in stream]


def test_in_band_error_event_after_content_becomes_an_anthropic_error_event() -> None:
    error = b'data: {"error": {"message": "engine died, key sk-secret-1234567890", "type": "api_error"}}\n\n'
    stream = run_stream(chunk({"content": "x"}), error + chunk({"content": "ignored"}))
    assert stream[-1][0] == "error" and "error mid-stream" in stream[-1][1]["error"]["message"]
    assert "sk-secret" not in stream[-1][1]["error"]["message"]  # the relay reports the upstream's words, redacted
    assert assembled(stream) == [{"type": "text", "text": "x"}]


def test_crlf_events_and_data_without_a_space_are_read() -> None:
    raw = b'data:{"choices":[{"index":0,"delta":{"content":"hi"}}]}\r\n\r\n'
    assert assembled(run_stream(raw)) == [{"type": "text", "text": "hi"}]


def test_an_empty_upstream_stream_still_gives_a_complete_message() -> None:
    names = [name for name, _ in run_stream(b"data: [DONE]\n\n")]
    assert names == ["message_start", "ping", "message_delta", "message_stop"]


def test_choices_without_an_index_are_read_and_other_choices_ignored() -> None:
    no_index = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    null_index = b'data: {"choices":[{"index":null,"delta":{"content":"b"}}]}\n\n'
    second = b'data: {"choices":[{"index":1,"delta":{"content":"zzz"}}]}\n\n'
    assert assembled(run_stream(no_index, null_index, second)) == [{"type": "text", "text": "ab"}]
