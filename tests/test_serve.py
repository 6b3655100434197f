"""Every API of the route table is served by one path (:mod:`latgate.api.serve`), so each
gets the same accounting: a client that leaves during its upload, before the first
token or after it is recorded alike on every API (``latgate_requests_total`` code 499,
one access line, its span ended with 499), the upstream closed; another method on an
API's route is a 405, and a body over ``max_body_bytes`` a 413, in that API's envelope."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from apis import APIS, RELAYED, STREAMED, body_for, error_type, post_head
from completions import content
from h1_upstreams import (
    SECRET,
    SSE_HEAD,
    Handler,
    RawUpstream,
    access_lines,
    chunk,
    json_reply,
    keep_serving,
    requests_with,
)
from h1_upstreams import config as upstream_config
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from processes import poll
from servers import serve_like_latgate_serve
from stack import gateway, one_upstream_config

from latgate.api.serve import Api
from latgate.app.asgi import create_app
from latgate.foundation.config import load_config_text
from latgate.request.tracing import TRACED_PATHS, Tracing

TOKEN = "hello-from-upstream"


@pytest.fixture
def access_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="latgate.access")
    return caplog


@contextlib.contextmanager
def traced_gateway(handler: Handler) -> Iterator[tuple[RawUpstream, int, InMemorySpanExporter]]:
    """A raw upstream serving ``handler`` and a gateway (served like ``latgate serve``)
    whose spans go to the exporter yielded: ``(upstream, gateway port, exporter)``."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with RawUpstream(handler) as up:
        config = load_config_text(upstream_config(up.base_url), source="t.toml", env={"UP_KEY": SECRET})
        app = create_app(config, env={"UP_KEY": SECRET}, tracing=Tracing(provider=provider))
        with serve_like_latgate_serve(app) as port:
            yield up, port, exporter
    provider.shutdown()


async def never_answers(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await up.request(reader)  # and nothing more until the gateway closes the connection


async def first_token_then_stall(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await up.request(reader)
    writer.write(SSE_HEAD + chunk(content(TOKEN)))
    await writer.drain()


def assert_recorded_as_client_closed(
    api: Api, port: int, caplog: pytest.LogCaptureFixture, exporter: InMemorySpanExporter
) -> None:
    """One access line (the last thing a request's finish writes) with 499 for ``api``,
    a 499 in the metrics and, for a traced API, its span ended with 499."""
    lines = poll(
        lambda: [line for line in access_lines(caplog) if line["path"] == api.paths[0]],
        timeout=10,
        what=f"the access line of {api.name}",
    )
    assert [line["status"] for line in lines] == [499], lines
    assert requests_with(port, 499) == 1
    if api.name in TRACED_PATHS:
        spans = exporter.get_finished_spans()
        assert [span.attributes["http.response.status_code"] for span in spans] == [499]


@pytest.mark.parametrize("api", APIS)
def test_a_client_leaving_during_its_upload_is_recorded_as_499_and_nothing_goes_upstream(api: Api, access_log) -> None:
    with traced_gateway(never_answers) as (up, port, exporter):
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(post_head(api, content_length=100_000) + b'{"model": "m", ')  # and leaves
        assert_recorded_as_client_closed(api, port, access_log, exporter)
        assert up.total == 0


@pytest.mark.parametrize("api", RELAYED)
def test_a_client_leaving_before_the_first_token_is_recorded_as_499_and_the_upstream_closed(
    api: Api, access_log
) -> None:
    payload = json.dumps(body_for(api, stream=api.streams)).encode()
    with traced_gateway(never_answers) as (up, port, exporter):
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(post_head(api, content_length=len(payload)) + payload)
            up.wait_until(lambda: len(up.requests) == 1)
        up.wait_until(lambda: up.open == 0)  # latgate closed the upstream request
        assert_recorded_as_client_closed(api, port, access_log, exporter)


@pytest.mark.parametrize("api", STREAMED)
def test_a_client_leaving_after_the_first_token_is_recorded_as_499_and_the_upstream_closed(
    api: Api, access_log
) -> None:
    with traced_gateway(first_token_then_stall) as (up, port, exporter):
        url = f"http://127.0.0.1:{port}{api.paths[0]}"
        with httpx.Client(timeout=10) as client, client.stream("POST", url, json=body_for(api, stream=True)) as answer:
            assert answer.status_code == 200
            received = b""
            for piece in answer.iter_raw():
                received += piece
                if TOKEN.encode() in received:
                    break  # the first token arrived: leave
        up.wait_until(lambda: up.open == 0)
        assert_recorded_as_client_closed(api, port, access_log, exporter)


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    config = "[server]\nmax_body_bytes = 1024\n" + one_upstream_config("http://127.0.0.1:9")
    with gateway(config) as gw:
        yield gw.url


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_another_method_on_an_api_route_is_405_in_its_envelope(api: Api, method: str, served: str) -> None:
    for path in api.paths:
        answer = httpx.request(method, served + path)
        assert answer.status_code == 405, path
        assert answer.headers["allow"] == "POST"
        assert error_type(api, answer.json()) == "invalid_request_error"


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "chunked"])
def test_a_body_over_the_limit_is_413_in_its_envelope(api: Api, declared: bool, served: str, access_log) -> None:
    body = json.dumps({**body_for(api), "pad": "x" * 2048}).encode()
    content = body if declared else iter([body[:1000], body[1000:]])  # an iterator: sent chunked, no length
    answer = httpx.post(served + api.paths[0], content=content, headers={"content-type": "application/json"})
    assert answer.status_code == 413
    anthropic = api.envelope.schema == "AnthropicError"
    assert error_type(api, answer.json()) == ("request_too_large" if anthropic else "invalid_request_error")
    assert [(line["path"], line["status"]) for line in access_lines(access_log)] == [(api.paths[0], 413)]


def _chat(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-small", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def _responses(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-small", max_retries=0)
    client.responses.create(model="m", input="hi", store=False)


def _messages(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="sk-small", max_retries=0)
    client.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    ("ask", "refused"),
    [
        pytest.param(_chat, openai.RateLimitError, id="chat-completions"),
        pytest.param(_responses, openai.RateLimitError, id="responses"),
        pytest.param(_messages, anthropic.RateLimitError, id="messages"),
    ],
)
def test_a_key_over_its_request_rate_gets_each_sdks_rate_limit_error(ask, refused: type[Exception]) -> None:
    auth = '[auth]\n[[auth.keys]]\nname = "small"\nkey = "sk-small"\nrpm = 1\n'
    with (
        RawUpstream(keep_serving(json_reply())) as up,
        gateway(upstream_config(up.base_url) + auth, env={"UP_KEY": SECRET}) as gw,
    ):
        ask(gw.url)
        with pytest.raises(refused) as caught:
            ask(gw.url)
        assert caught.value.response.headers["retry-after"].isdigit()
        assert len(up.requests) == 1


def test_the_access_line_records_the_path_as_the_client_sent_it(access_log) -> None:
    """``/v1/chat/completions`` and ``/chat/completions`` each as sent (operators grep for them)."""
    sent = [(param.values[0], path) for param in RELAYED for path in param.values[0].paths]
    with RawUpstream(keep_serving(json_reply())) as up, gateway(one_upstream_config(up.base_url)) as gw:
        for api, path in sent:
            httpx.post(gw.url + path, json=body_for(api), timeout=10)
        lines = poll(lambda: len(access_lines(access_log)) == len(sent) and access_lines(access_log), timeout=10,
                     what="one access line per request")  # fmt: skip
    assert [line["path"] for line in lines] == [path for _, path in sent]
    assert "/v1/chat/completions" in [line["path"] for line in lines]
