"""Optional OpenTelemetry tracing: one SERVER span per proxied request, W3C Trace
Context (https://www.w3.org/TR/trace-context/) from the client and on to the upstream."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from replay import ReplayScript, ReplayServer, load_stream, replay_server
from stack import gateway, one_upstream_config

from latgate.request.tracing import Tracing, tracing_from_env

CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
PROMPT_TEXT = "the-secret-prompt-text-7d1c"
UPSTREAM_KEY = "sk-upstream-key-never-in-spans"
CLIENT_KEY = "sk-client-key-never-in-spans"

CHAT_BODY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "served-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
}


@contextlib.contextmanager
def traced_gateway(
    script: ReplayScript,
    *,
    exporter: InMemorySpanExporter | None,
    config_extra: str = "",
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[ReplayServer, str]]:
    """A replay upstream behind a gateway whose spans go to ``exporter`` (``None``:
    tracing off, no OTEL_* variables): ``(upstream, gateway /v1 URL)``."""
    env = dict(env or {})
    tracing = None
    if exporter is not None:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracing = Tracing(provider=provider)
    with (
        replay_server(script) as upstream,
        gateway(one_upstream_config(upstream.base_url) + config_extra, env=env, tracing=tracing) as stack,
    ):
        yield upstream, stack.v1


def parse_traceparent(value: str | None) -> tuple[str, str]:
    """``(trace id, parent span id)`` of a version-00 ``traceparent`` (hex)."""
    assert value is not None
    version, trace_id, parent_id, flags = value.split("-")
    assert (version, len(trace_id), len(parent_id), len(flags)) == ("00", 32, 16, 2)
    return trace_id, parent_id


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    spans = exporter.get_finished_spans()
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def test_streamed_chat_span_joins_client_trace_and_is_parent_of_upstream_request() -> None:
    exporter = InMemorySpanExporter()
    with traced_gateway(ReplayScript.sse(load_stream("vllm_chat")), exporter=exporter) as (upstream, v1):
        r = httpx.post(
            v1 + "/chat/completions",
            json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hello"}]},
            headers={"traceparent": CLIENT_TRACEPARENT, "tracestate": "vendor=abc"},
        )
        assert r.status_code == 200
        r.read()
    span = only_span(exporter)
    assert span.name == "POST /v1/chat/completions"
    assert span.kind is SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == CLIENT_TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == CLIENT_SPAN_ID
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.request.model"] == "m"
    assert attributes["gen_ai.response.model"] == "m"  # the provider passes the model through
    assert attributes["gen_ai.usage.input_tokens"] == 17
    assert attributes["gen_ai.usage.output_tokens"] == 10
    assert attributes["http.response.status_code"] == 200
    assert attributes["latgate.provider"] == "up"
    assert attributes["latgate.endpoint"]
    assert attributes["latgate.route.reason"]
    assert attributes["latgate.attempts"] == 1
    assert attributes["latgate.ttft_ms"] > 0
    assert span.status.status_code is not StatusCode.ERROR

    sent = upstream.requests[0]
    trace_id, parent_id = parse_traceparent(sent.header("traceparent"))
    assert trace_id == CLIENT_TRACE_ID
    assert parent_id == format(span.context.span_id, "016x")
    assert sent.header("tracestate") == "vendor=abc"


def test_request_without_traceparent_starts_a_new_trace_that_goes_upstream() -> None:
    exporter = InMemorySpanExporter()
    with traced_gateway(ReplayScript.json_response(200, CHAT_BODY), exporter=exporter) as (upstream, v1):
        r = httpx.post(
            v1 + "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 200
    span = only_span(exporter)
    assert span.parent is None
    attributes = dict(span.attributes or {})
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (11, 3)
    trace_id, parent_id = parse_traceparent(upstream.requests[0].header("traceparent"))
    assert (trace_id, parent_id) == (
        format(span.context.trace_id, "032x"),
        format(span.context.span_id, "016x"),
    )


def test_upstream_server_error_marks_the_span_as_error() -> None:
    exporter = InMemorySpanExporter()
    failure = {"error": {"message": "overloaded", "type": "server_error", "code": None}}
    with traced_gateway(ReplayScript.json_response(500, failure), exporter=exporter) as (_, v1):
        r = httpx.post(v1 + "/embeddings", json={"model": "m", "input": "x"})
        assert r.status_code >= 500
    span = only_span(exporter)
    assert span.name == "POST /v1/embeddings"
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["http.response.status_code"] == r.status_code


def test_invalid_traceparent_from_client_starts_a_fresh_trace() -> None:
    exporter = InMemorySpanExporter()
    with traced_gateway(ReplayScript.json_response(200, CHAT_BODY), exporter=exporter) as (upstream, v1):
        httpx.post(
            v1 + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"traceparent": "00-zz-not-a-trace"},
        )
    span = only_span(exporter)
    assert span.parent is None
    assert parse_traceparent(upstream.requests[0].header("traceparent"))[0] == format(
        span.context.trace_id, "032x"
    )


def test_no_key_or_prompt_text_in_span_attributes() -> None:
    exporter = InMemorySpanExporter()
    config_extra = 'api_key_env = "UP_KEY"\n'
    with traced_gateway(
        ReplayScript.json_response(200, CHAT_BODY),
        exporter=exporter,
        config_extra=config_extra,
        env={"UP_KEY": UPSTREAM_KEY},
    ) as (upstream, v1):
        r = httpx.post(
            v1 + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": PROMPT_TEXT}]},
            headers={"authorization": f"Bearer {CLIENT_KEY}"},
        )
        assert r.status_code == 200
    assert upstream.requests[0].header("authorization") == f"Bearer {UPSTREAM_KEY}"  # the key was in play
    span = only_span(exporter)
    values = " ".join(str(v) for v in (span.attributes or {}).values()) + span.name
    for secret in (PROMPT_TEXT, UPSTREAM_KEY, CLIENT_KEY):
        assert secret not in values


def test_tracing_off_sends_no_traceparent_upstream() -> None:
    with traced_gateway(ReplayScript.json_response(200, CHAT_BODY), exporter=None) as (upstream, v1):
        r = httpx.post(
            v1 + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"traceparent": CLIENT_TRACEPARENT},
        )
        assert r.status_code == 200
    assert upstream.requests[0].header("traceparent") is None
    assert upstream.requests[0].header("tracestate") is None


def test_tracing_is_off_without_otel_variables() -> None:
    assert tracing_from_env({}) is None
    assert (
        tracing_from_env({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
        is None
    )
    assert (
        tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
        is None
    )
    # a gateway built without them sends no traceparent: test_tracing_off_sends_no_traceparent_upstream


def test_console_exporter_from_env_turns_tracing_on() -> None:
    tracing = tracing_from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "edge-gw"})
    assert tracing is not None
    try:
        assert tracing.provider.resource.attributes["service.name"] == "edge-gw"
        assert tracing.start(path="/messages/count_tokens", headers={}) is None  # not a proxied request
    finally:
        tracing.shutdown()


def test_missing_otlp_exporter_logs_one_line_and_leaves_tracing_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with caplog.at_level(logging.WARNING, logger="latgate"):
        assert tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "tracing off" in lines[0] and "latgate[tracing]" in lines[0]


def test_unknown_exporter_logs_one_line_and_leaves_tracing_off(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="latgate"):
        assert tracing_from_env({"OTEL_TRACES_EXPORTER": "zipkin"}) is None
    assert [r.getMessage() for r in caplog.records] == [
        "tracing off: OTEL_TRACES_EXPORTER=zipkin is not one of otlp, console"
    ]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completions", {"model": "m", "prompt": "hi"}),
        ("/messages", {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}),
        ("/responses", {"model": "m", "input": "hi"}),
    ],
)
def test_every_proxied_api_gets_its_span_and_traceparent_upstream(path: str, body: dict[str, object]) -> None:
    exporter = InMemorySpanExporter()
    with traced_gateway(ReplayScript.json_response(200, CHAT_BODY), exporter=exporter) as (upstream, v1):
        r = httpx.post(v1 + path, json=body, headers={"traceparent": CLIENT_TRACEPARENT})
        assert r.status_code == 200
    span = only_span(exporter)
    assert span.name == "POST /v1" + path
    assert format(span.context.trace_id, "032x") == CLIENT_TRACE_ID
    assert dict(span.attributes or {})["gen_ai.response.model"] == "m"
    assert parse_traceparent(upstream.requests[0].header("traceparent"))[1] == format(
        span.context.span_id, "016x"
    )
