"""Responses API request -> chat completions request (latgate.request.translate.responses_request)."""

from __future__ import annotations

import pytest

from latgate.foundation.errors import InvalidRequest
from latgate.request.translate.responses_request import responses_to_chat

SHELL = {
    "type": "function",
    "name": "shell",
    "description": "run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "strict": False,
}


def _chat(**body) -> dict:
    return responses_to_chat({"model": "m", **body}).chat_body


def test_string_input_and_instructions_become_system_and_user_messages() -> None:
    chat = _chat(input="hello", instructions="be brief")
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    assert chat["model"] == "m"


def test_message_items_map_roles_and_join_text_parts() -> None:
    chat = _chat(
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        ]
    )
    assert chat["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "ok"},
    ]


def test_user_image_part_becomes_an_image_url_part() -> None:
    content = [
        {"type": "input_text", "text": "what is this"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA"},
    ]
    (message,) = _chat(input=[{"role": "user", "content": content}])["messages"]
    assert message["content"] == [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
    ]


def test_function_calls_and_outputs_become_tool_calls_and_tool_messages() -> None:
    chat = _chat(
        input=[
            {"role": "user", "content": "list files"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Looking."}],
            },
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"command":"ls"}'},
            {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": '{"command":"pwd"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "/w"}],
            },
        ]
    )
    user, assistant, first, second = chat["messages"]
    assert user == {"role": "user", "content": "list files"}
    assert assistant["content"] == "Looking."
    assert [call["id"] for call in assistant["tool_calls"]] == ["c1", "c2"]
    assert assistant["tool_calls"][1]["function"] == {"name": "shell", "arguments": '{"command":"pwd"}'}
    assert first == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}
    assert second == {"role": "tool", "tool_call_id": "c2", "content": "/w"}


def test_function_tools_and_tool_choice_translate_and_hosted_tools_are_dropped() -> None:
    chat = _chat(
        input="hi",
        tools=[SHELL, {"type": "web_search"}],
        tool_choice={"type": "function", "name": "shell"},
        parallel_tool_calls=False,
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "description": "run a command",
                "parameters": SHELL["parameters"],
                "strict": False,
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "shell"}}
    assert chat["parallel_tool_calls"] is False


def test_generation_options_map_to_their_chat_names() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat = _chat(
        input="hi",
        max_output_tokens=256,
        reasoning={"effort": "low", "summary": "auto"},
        text={
            "format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True},
            "verbosity": "low",
        },
        temperature=0.2,
        prompt_cache_key="session-1",
        include=["reasoning.encrypted_content"],
        store=False,
    )
    assert chat["max_completion_tokens"] == 256
    assert chat["reasoning_effort"] == "low"
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert chat["verbosity"] == "low"
    assert (chat["temperature"], chat["prompt_cache_key"]) == (0.2, "session-1")
    assert "include" not in chat and "store" not in chat


def test_streams_ask_for_usage() -> None:
    translation = responses_to_chat({"model": "m", "input": "hi", "stream": True})
    assert translation.stream is True
    assert translation.chat_body["stream_options"] == {"include_usage": True}


def test_echo_carries_the_response_api_defaults() -> None:
    echo = responses_to_chat({"model": "m", "input": "hi"}).echo
    assert (echo["tool_choice"], echo["parallel_tool_calls"], echo["tools"], echo["metadata"]) == (
        "auto",
        True,
        [],
        {},
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "store": True}, "store"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "conversation": "conv_1"}, "conversation"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0]"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({}, "input"),
        ({"input": 3}, "input"),
        ({"input": "hi", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": "hi", "stream": "yes"}, "stream"),
    ],
)
def test_requests_latgate_cannot_serve_are_refused_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        responses_to_chat({"model": "m", **body})
    assert raised.value.status == 400
    assert raised.value.param == param


def test_store_true_is_refused_with_a_message_saying_what_to_send() -> None:
    with pytest.raises(InvalidRequest, match="latgate keeps no responses; send 'store: false'"):
        responses_to_chat({"model": "m", "input": "hi", "store": True})


def test_namespace_tools_are_flattened_and_namespaced_calls_in_history_follow() -> None:
    spawn = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}, "strict": False}
    translation = responses_to_chat(
        {
            "model": "m",
            "tools": [
                {"type": "namespace", "name": "multi_agent", "description": "agents", "tools": [spawn]}
            ],
            "input": [
                {"role": "user", "content": "go"},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "namespace": "multi_agent",
                    "name": "spawn_agent",
                    "arguments": "{}",
                },
            ],
        }
    )
    assert [tool["function"]["name"] for tool in translation.chat_body["tools"]] == [
        "multi_agent__spawn_agent"
    ]
    assert translation.namespaced == {"multi_agent__spawn_agent": ("multi_agent", "spawn_agent")}
    assert (
        translation.chat_body["messages"][1]["tool_calls"][0]["function"]["name"]
        == "multi_agent__spawn_agent"
    )


@pytest.mark.parametrize("role", [{"a": {}}, ["user"], 3])
def test_a_role_that_is_not_a_string_is_a_400_naming_the_field(role) -> None:
    with pytest.raises(InvalidRequest) as caught:
        responses_to_chat({"model": "m", "input": [{"role": role, "content": "hi"}]})
    assert caught.value.status == 400 and caught.value.param == "input[0].role"
