"""``POST /v1/responses`` passed through to providers that serve the Responses API
themselves (``responses_api = true``): the client's body goes to ``/responses`` untranslated
and the event stream comes back untouched, timed and counted like any stream."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx
import openai
import orjson
import pytest
from replay import ReplayScript, replay_server, split_points
from stack import FAST, gateway, simulators

from latgate.api.responses import serves_responses
from latgate.commands.check import report_lines
from latgate.commands.sim import SimOptions
from latgate.forwarding.exchange import Exchange
from latgate.forwarding.sse import StreamTap
from latgate.foundation.config import load_config_text
from latgate.foundation.config.errors import ConfigError
from latgate.routing.decision import RouteDecision, Target

CONFIG = """
[providers.native]
api_base = "{native}/v1"
models = ["up-model"]
responses_api = true
extra_body = {{ service_tier = "flex" }}

[providers.mixed]
api_base = "{mixed}/v1"
models = ["mixed-model"]
responses_api = true

[providers.chat]
api_base = "{chat}/v1"
models = ["chat-model", "mixed-model"]

[routing]
default_route = "native"
fallbacks = {{ "mixed" = ["chat"] }}

[aliases]
"gpt-5-codex" = "up-model"
"""


@pytest.fixture(scope="module")
def stack():
    sims = {name: SimOptions(name=name, **FAST) for name in ("native", "mixed", "chat")}
    with simulators(sims) as running:
        text = CONFIG.format(**{name: url for name, (url, _) in running.items()})
        with gateway(text) as s:
            s.sims = {name: app for name, (_, app) in running.items()}
            yield s


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.v1, api_key="sk-test", max_retries=0)


def _metric(stack, name: str, **labels: str) -> float:
    text = httpx.get(stack.url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _eventually(check: Callable[[], bool], *, timeout_seconds: float = 5.0) -> None:
    """Polls ``check``: the exchange is finished just after its last byte was sent."""
    deadline = time.monotonic() + timeout_seconds
    while not check() and time.monotonic() < deadline:
        pass
    assert check()


def test_streamed_request_to_a_native_provider_passes_through_and_is_measured(stack, client) -> None:
    ttft_before = _metric(
        stack, "latgate_time_to_first_token_seconds_count", provider="native", model="gpt-5-codex"
    )
    tokens_before = _metric(stack, "latgate_completion_tokens_total", provider="native", model="gpt-5-codex")
    stream = client.responses.create(
        model="gpt-5-codex",
        input="hello",
        instructions="be brief",
        stream=True,
        store=False,
        prompt_cache_key="k1",
    )
    events = list(stream)
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in types and types[-1] == "response.completed"
    final = events[-1].response
    assert final.model == "gpt-5-codex" and final.output_text
    sent = stack.sims["native"].stats.last_request
    assert sent.path == "/v1/responses"
    assert sent.body == {
        "model": "up-model",
        "input": "hello",
        "instructions": "be brief",
        "stream": True,
        "store": False,
        "prompt_cache_key": "k1",
        "service_tier": "flex",
    }
    labels = {"provider": "native", "model": "gpt-5-codex"}
    ttft = "latgate_time_to_first_token_seconds_count"
    _eventually(lambda: _metric(stack, ttft, **labels) == ttft_before + 1)
    tokens = tokens_before + final.usage.output_tokens
    _eventually(lambda: _metric(stack, "latgate_completion_tokens_total", **labels) == tokens)


def test_non_streamed_request_to_a_native_provider_passes_through(stack, client) -> None:
    raw = client.responses.with_raw_response.create(model="gpt-5-codex", input="hi", store=False)
    response = raw.parse()
    assert raw.headers["x-latgate-provider"] == "native"
    assert response.status == "completed" and response.output_text and response.model == "gpt-5-codex"
    assert stack.sims["native"].stats.last_request.path == "/v1/responses"


def test_a_candidate_without_responses_api_means_translation(stack, client) -> None:
    with client.responses.stream(model="mixed-model", input="hello", store=False) as events:
        final = events.get_final_response()
    assert final.output_text
    sent = stack.sims["mixed"].stats.last_request
    assert sent.path == "/v1/chat/completions" and sent.body["messages"][-1] == {
        "role": "user",
        "content": "hello",
    }


def test_stored_state_is_refused_on_the_pass_through_path_too(stack) -> None:
    r = httpx.post(stack.v1 + "/responses", json={"model": "gpt-5-codex", "input": "hi", "store": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "store"


RECORDED = b"".join(
    b"event: "
    + kind.encode()
    + b"\ndata: "
    + orjson.dumps({"type": kind, "sequence_number": n, **fields})
    + b"\n\n"
    for n, (kind, fields) in enumerate(
        [
            (
                "response.created",
                {
                    "response": {
                        "id": "resp_1",
                        "object": "response",
                        "model": "up",
                        "status": "in_progress",
                        "output": [],
                    }
                },
            ),
            (
                "response.output_item.added",
                {
                    "output_index": 0,
                    "item": {
                        "id": "msg_1",
                        "type": "message",
                        "role": "assistant",
                        "status": "in_progress",
                        "content": [],
                    },
                },
            ),
            (
                "response.output_text.delta",
                {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Hel"},
            ),
            (
                "response.output_text.delta",
                {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "lo é"},
            ),
            (
                "response.output_text.delta",
                {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "!"},
            ),
            (
                "response.completed",
                {
                    "response": {
                        "id": "resp_1",
                        "object": "response",
                        "model": "up",
                        "status": "completed",
                        "output": [],
                        "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10},
                    }
                },
            ),
        ]
    )
)


def test_recorded_responses_stream_reaches_the_client_byte_for_byte() -> None:
    script = ReplayScript.sse(RECORDED, split_at=split_points(RECORDED, "random", seed=3, count=9))
    with replay_server(script) as upstream:
        config = f'[providers.up]\napi_base = "{upstream.base_url}"\nmodels = ["up"]\nresponses_api = true\n'
        with gateway(config) as stack:
            body = {"model": "up", "input": "hi", "stream": True}
            with httpx.stream("POST", stack.v1 + "/responses", json=body) as r:
                received = r.read()
            _eventually(lambda: "latgate_completion_tokens" in httpx.get(stack.url + "/metrics").text)
            metrics = httpx.get(stack.url + "/metrics").text
    assert received == RECORDED
    assert upstream.requests[0].path == "/v1/responses" and orjson.loads(upstream.requests[0].body) == body
    assert 'latgate_completion_tokens_total{model="up",outcome="ok",provider="up"} 3.0' in metrics
    assert 'latgate_prompt_tokens_total{model="up",outcome="ok",provider="up"} 7.0' in metrics
    assert re.search(r'latgate_time_to_first_token_seconds_count\{model="up",provider="up"\} 1\.0', metrics)


def test_tap_counts_responses_delta_events_and_reads_their_usage() -> None:
    tap = StreamTap(drop_usage_chunk=True)
    forwarded, units = tap.feed(RECORDED)
    assert forwarded == RECORDED and units == 3 and tap.content_chunks == 3
    exchange = Exchange(request_id="r", received_at=0.0, path="/responses", stream=True)
    exchange.apply_usage(tap.usage)
    assert (exchange.prompt_tokens, exchange.completion_tokens) == (7, 3)


def test_tap_treats_a_responses_error_event_as_an_in_band_error() -> None:
    event = (
        b"event: error\ndata: "
        + orjson.dumps({"type": "error", "code": "server_error", "message": "boom", "sequence_number": 0})
        + b"\n\n"
    )
    tap = StreamTap()
    forwarded, units = tap.feed(event)
    assert forwarded == b"" and units == 0 and tap.error["message"] == "boom"


def test_tap_still_counts_chat_chunks_and_keeps_chat_usage() -> None:
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}\n\n'
    tap = StreamTap(drop_usage_chunk=True)
    forwarded, units = tap.feed(chunk)
    assert units == 1 and forwarded == b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'


def _decision(*providers: str, overflow: tuple[str, ...] = ()) -> RouteDecision:
    targets = tuple(Target(name, "m", "default") for name in providers)
    return RouteDecision(
        provider=providers[0],
        model="m",
        public_model="m",
        reason="default",
        prompt_tokens=1,
        latency_sensitive=False,
        budget_ms=None,
        policy=None,
        hedge=False,
        candidates=targets,
        notes=(),
        overflow=tuple(Target(name, "m", f"overflow:{providers[0]}") for name in overflow),
    )


def test_pass_through_needs_every_candidate_and_overflow_to_serve_responses() -> None:
    config = load_config_text(
        '[providers.a]\napi_base = "http://a:1/v1"\nresponses_api = true\n'
        '[providers.b]\napi_base = "http://b:1/v1"\nresponses_api = true\n'
        '[providers.c]\napi_base = "http://c:1/v1"\n',
        source="t.toml",
        env={},
    )
    providers = config.providers
    assert serves_responses(providers, _decision("a", "b"))
    assert not serves_responses(providers, _decision("a", "c"))
    assert not serves_responses(providers, _decision("a", overflow=("c",)))
    assert not serves_responses(providers, _decision("c"))


def test_responses_api_defaults_to_false_and_must_be_a_boolean() -> None:
    base = '[providers.a]\napi_base = "http://a:1/v1"\n'
    assert load_config_text(base, source="t.toml", env={}).providers["a"].responses_api is False
    with pytest.raises(ConfigError) as caught:
        load_config_text(base + 'responses_api = "yes"\n', source="t.toml", env={})
    assert "providers.a.responses_api" in str(caught.value) and "true or" in str(caught.value)


def test_check_report_shows_the_responses_api_flag() -> None:
    config = load_config_text(
        '[providers.a]\napi_base = "http://a:1/v1"\nresponses_api = true\n', source="t.toml", env={}
    )
    assert any("serves /responses" in line for line in report_lines(config, warnings=[]))
