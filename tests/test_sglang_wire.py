"""SGLang's wire formats through latgate (``tests/fixtures/sglang/``, written after
SGLang's OpenAI serving code: SGLang cannot run on these machines): the usage chunk
asked for on a client's behalf is invisible, usage is counted, a 400 reaches the client
with SGLang's own fields, and ``/v1/models`` gives the context window."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import orjson
import pytest
from replay import ReplayScript, split_points
from stack import replay_gateway

from latgate.live.providers.catalog import context_tokens, parse_catalog

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
CHAT = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def post_stream(url: str, body: dict) -> bytes:
    with httpx.Client(timeout=10) as client, client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        return response.read()


@pytest.mark.parametrize("how", ["whole", "events", "random"])
def test_a_client_that_did_not_ask_for_usage_gets_sglangs_no_usage_stream(how: str, caplog: pytest.LogCaptureFixture) -> None:
    body = fixture("chat_stream_usage.sse")
    caplog.set_level(logging.INFO, logger="latgate.access")
    points = [] if how == "whole" else split_points(body, how, seed=5)
    with replay_gateway(ReplayScript.sse(body, split_at=points)) as (upstream, stack):
        out = post_stream(stack.v1 + "/chat/completions", CHAT)
        assert upstream.requests[0].json()["stream_options"] == {"include_usage": True}
    assert out == fixture("chat_stream_nousage.sse")
    line = next(orjson.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access")
    assert (line["prompt_tokens"], line["completion_tokens"], line["usage_estimated"]) == (9, 3, False)


def test_a_client_that_asked_for_usage_gets_sglangs_usage_chunk() -> None:
    body = fixture("chat_stream_usage.sse")
    with replay_gateway(ReplayScript.sse(body)) as (_, stack):
        out = post_stream(stack.v1 + "/chat/completions", {**CHAT, "stream_options": {"include_usage": True}})
    assert out == body


@pytest.mark.parametrize("stream", [False, True])
def test_sglangs_400_reaches_the_client_with_its_own_fields(stream: bool) -> None:
    error = json.loads(fixture("context_400.json"))
    with replay_gateway(ReplayScript.json_response(400, error)) as (_, stack):
        answer = httpx.post(stack.v1 + "/chat/completions", json={**CHAT, "stream": stream}, timeout=10)
    assert answer.status_code == 400
    assert answer.json() == {"error": error}  # the OpenAI envelope around SGLang's top-level object
    assert answer.headers["x-latgate-provider"] == "up"


def test_sglangs_model_list_gives_the_context_window() -> None:
    assert context_tokens(parse_catalog(fixture("models.json")), "qwen") == 1024
