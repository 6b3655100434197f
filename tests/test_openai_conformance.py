"""latgate's OpenAI surface validated against the official OpenAI API description."""

from __future__ import annotations

import httpx
import jsonschema
import orjson
import pytest
from openapi import validate

MESSAGES = [{"role": "user", "content": "hello"}]


def test_streamed_chunks_match_create_chat_completion_stream_response(demo) -> None:
    r = httpx.post(
        demo.v1 + "/chat/completions",
        json={"model": "glm-5.1", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = [e for e in r.content.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    for event in events[:-1]:
        validate(orjson.loads(event.removeprefix(b"data: ")), "CreateChatCompletionStreamResponse")


def test_non_streamed_answer_matches_create_chat_completion_response(demo) -> None:
    r = httpx.post(demo.v1 + "/chat/completions", json={"model": "glm-5.1-highspeed", "messages": MESSAGES})
    validate(r.json(), "CreateChatCompletionResponse")


def test_model_list_and_model_match_their_schemas(demo) -> None:
    validate(httpx.get(demo.v1 + "/models").json(), "ListModelsResponse")
    validate(httpx.get(demo.v1 + "/models/glm-5.1").json(), "Model")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", b"{bad"),
        ("/chat/completions", b'{"model": "glm-5.1"}'),
        ("/nope", b"{}"),
    ],
)
def test_errors_match_error_response(demo, path: str, body: bytes) -> None:
    r = httpx.post(demo.v1 + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code >= 400
    validate(r.json(), "ErrorResponse")


def test_the_validator_rejects_a_non_conforming_chunk() -> None:
    with pytest.raises(jsonschema.ValidationError):
        validate({"object": "chat.completion.chunk", "choices": "nope"}, "CreateChatCompletionStreamResponse")
