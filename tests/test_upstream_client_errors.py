"""An upstream's answer to a faulty request reaches the client as the upstream wrote it,
with the provider named in a header; a provider rejecting latgate's own key stays
latgate's error, saying so."""

from __future__ import annotations

import logging

import httpx
import orjson
import pytest
from completions import chat_completion
from replay import ReplayScript
from stack import replay_gateway

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

#: vLLM 0.32's own 400 for a prompt over its context (as its server writes it)
VLLM_CONTEXT_400 = {
    "error": {
        "message": "This model's maximum context length is 1024 tokens. However, your prompt contains at least "
        "1025 input tokens, which exceeds the limit. Please reduce the length of the input prompt. "
        "(parameter=input_tokens, value=1025)",
        "type": "BadRequestError",
        "param": "input_tokens",
        "code": 400,
    }
}


@pytest.mark.parametrize("status", [400, 404, 413, 422])
@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_client_error_reaches_the_client_as_written(status: int, stream: bool) -> None:
    with replay_gateway(ReplayScript.json_response(status, VLLM_CONTEXT_400)) as (upstream, stack):
        answer = httpx.post(stack.v1 + "/chat/completions", json={**CHAT, "stream": stream}, timeout=10)
        assert len(upstream.requests) == 1  # the client's own mistake: not retried
    assert answer.status_code == status
    assert answer.json() == VLLM_CONTEXT_400
    assert answer.headers["x-latgate-provider"] == "up"


@pytest.mark.parametrize("status", [401, 403])
def test_a_provider_rejecting_latgates_key_stays_a_gateway_error(status: int, caplog: pytest.LogCaptureFixture) -> None:
    """Not a 401/403: the client's own key is fine, and an SDK would report it as invalid."""
    upstream_says = {"error": {"message": "Invalid API key sk-123", "type": "invalid_request_error", "code": "invalid_api_key"}}
    with (
        caplog.at_level("WARNING", logger="latgate.upstream"),
        replay_gateway(ReplayScript.json_response(status, upstream_says)) as (_, stack),
    ):
        answer = httpx.post(stack.v1 + "/chat/completions", json=CHAT, timeout=10)
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["message"] == f"provider 'up' rejected latgate's credentials (HTTP {status})"
    assert error["type"] == "api_error"
    assert error["code"] == "provider_auth_failed"
    assert "sk-123" not in answer.text
    logged = [r.getMessage() for r in caplog.records if "rejected latgate's credentials" in r.getMessage()]
    assert logged and "sk-123" not in logged[0]


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_tokens_header_is_routings_estimate_and_the_log_has_the_upstreams(
    stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The upstream counts 999 prompt tokens: the header still says what routing estimated."""
    usage = {"prompt_tokens": 999, "completion_tokens": 1, "total_tokens": 1000}
    if stream:
        body = (
            b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            b'"delta":{"content":"x"},"finish_reason":"stop"}]}\n\n'
            b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":'
            + orjson.dumps(usage) + b"}\n\ndata: [DONE]\n\n"
        )
        script = ReplayScript.sse(body)
    else:
        script = ReplayScript.json_response(200, {**chat_completion(), "usage": usage})
    caplog.set_level(logging.INFO, logger="latgate.access")
    with replay_gateway(script) as (_, stack):
        answer = httpx.post(stack.v1 + "/chat/completions", json={**CHAT, "stream": stream}, timeout=10)
        answer.read()
    assert answer.status_code == 200
    estimate = int(answer.headers["x-latgate-prompt-tokens"])
    assert 0 < estimate < 999
    line = next(orjson.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access")
    assert line["prompt_tokens"] == 999


@pytest.mark.parametrize(
    ("upstream", "client"),
    [
        ("application/json; charset=utf-8", "application/json; charset=utf-8"),
        ('application/json; charset="UTF-8"; key=sk-secret', "application/json; charset=utf-8"),
        ("application/json; boundary=sk-secret", "application/json"),
        ("application/json", "application/json"),
    ],
)
def test_only_the_charset_parameter_of_the_upstream_content_type_is_kept(upstream: str, client: str) -> None:
    script = ReplayScript(
        status=200, headers=(("content-type", upstream),), body_pieces=(orjson.dumps(chat_completion()),), framing="content-length"
    )
    with replay_gateway(script) as (_, stack):
        answer = httpx.post(stack.v1 + "/chat/completions", json=CHAT, timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == client
