"""Keep-alives while a stream waits for its first token, through the gateway: after
``first_token_keepalive_sec`` the 200 head goes out and an SSE comment (an Anthropic
``ping`` on ``/v1/messages``) follows every interval until content, the upstream's own
comments pass on as they come, and retries and fallbacks still happen inside the same
response. The silent prefill lasts until the client has seen keep-alives (the upstream
is released by the client, never by a timer), with a short interval set in the config.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from types import ModuleType

import anthropic
import httpx
import httpx2
import openai
import pytest
from completions import DONE, ROLE, chat_chunk, content, event
from replay import ReplayScript, ReplayServer, replay_server
from stack import gateway

from latgate.forwarding.keepalive import keepalive_seconds
from latgate.foundation.config.schema import (
    Config,
    DefaultsConfig,
    EndpointConfig,
    PolicyConfig,
    ProviderConfig,
    RoutingConfig,
)
from latgate.routing.decision import Router

KEEPALIVE = b": keep-alive\n\n"
PING = b'event: ping\ndata: {"type": "ping"}\n\n'
STOP = event(chat_chunk({}, finish_reason="stop"))
STREAM = ROLE + content("Hello") + content(" world") + STOP + DONE
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
#: bound on keep-alives read in one test (~10 s at the interval below): a test never hangs
MAX_KEEPALIVES = 200
INTERVAL = 0.05


def config(*bases: str, keepalive: float = INTERVAL, ftt: float = 30) -> str:
    providers = "".join(f'[providers.up{i}]\napi_base = "{base}"\n\n' for i, base in enumerate(bases))
    fallbacks = '[routing]\nfallbacks = { up0 = ["up1"] }\n' if len(bases) > 1 else ""
    return (
        f"[defaults]\ntimeout_sec = 30\nconnect_timeout_sec = 2\nmax_retries = 0\n"
        f"first_token_timeout_sec = {ftt}\nfirst_token_keepalive_sec = {keepalive}\n\n{providers}{fallbacks}"
    )


def silent(*pieces: bytes, **options: object) -> ReplayScript:
    """An upstream that reads the request and answers only once released (a long prefill)."""
    return ReplayScript(body_pieces=pieces, stall_before_headers=True, **options)


def read_until(response: httpx.Response, on_keepalive: Callable[[int], None], marker: bytes = KEEPALIVE) -> bytes:
    """The whole body, calling ``on_keepalive(count)`` after each keep-alive read."""
    received = b""
    for piece in response.iter_raw():
        before = received.count(marker)
        received += piece
        count = received.count(marker)
        if count > before:
            assert count < MAX_KEEPALIVES, "the stream never went on"
            on_keepalive(count)
    return received


def test_a_silent_prefill_gets_the_head_then_keep_alives_then_the_stream_unchanged() -> None:
    with replay_server(silent(STREAM)) as up, gateway(config(up.base_url)) as gw:
        with httpx.stream("POST", gw.v1 + "/chat/completions", json=CHAT, timeout=10) as r:
            assert r.status_code == 200  # the head went out while the upstream was silent
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-latgate-provider"] == "up0"
            received = read_until(r, lambda count: count >= 3 and up.release.set())
        assert received.startswith(KEEPALIVE * 3)
        assert received.replace(KEEPALIVE, b"") == STREAM
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'latgate_requests_total{code="200",model="other",provider="up0"} 1.0' in metrics


def test_upstream_comments_are_passed_on_as_they_come() -> None:
    upstream_comment = b": OPENROUTER PROCESSING\n\n"
    comment = b":\n\n"  # as forwarded: a bare comment, the upstream's text never reaches a client
    script = silent(upstream_comment, STREAM, hold_after_pieces=1)
    with replay_server(script) as up, gateway(config(up.base_url)) as gw:
        with httpx.stream("POST", gw.v1 + "/chat/completions", json=CHAT, timeout=10) as r:
            received = b""
            for piece in r.iter_raw():
                received += piece
                up.release.set()  # the head and a keep-alive came: the upstream answers with its comment
                if comment in received:
                    up.resume.set()  # the comment reached the client before any content: go on
                assert received.count(KEEPALIVE) < MAX_KEEPALIVES, "the upstream's comment was held back"
        assert received.replace(KEEPALIVE, b"") == comment + STREAM


def test_a_failure_after_the_head_still_fails_over_inside_the_same_response() -> None:
    with (
        replay_server(silent(STREAM)) as stuck,
        replay_server(ReplayScript.sse(STREAM)) as spare,
        gateway(config(stuck.base_url, spare.base_url, ftt=1)) as gw,
    ):
        r = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=10)
        assert r.status_code == 200
        assert r.content.startswith(KEEPALIVE) and r.content.replace(KEEPALIVE, b"") == STREAM
        assert len(stuck.requests) == len(spare.requests) == 1
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'latgate_requests_total{code="200",model="other",provider="up1"} 1.0' in metrics
        assert 'latgate_fallbacks_total{from="up0",to="up1"} 1.0' in metrics


def test_a_failure_after_the_head_with_no_fallback_ends_with_an_error_event_and_no_done() -> None:
    with replay_server(silent(STREAM)) as stuck, gateway(config(stuck.base_url, ftt=0.5)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=10)
        assert r.status_code == 200 and r.content.startswith(KEEPALIVE)
        tail = r.content.replace(KEEPALIVE, b"")
        assert b"[DONE]" not in tail
        error = json.loads(tail.removeprefix(b"data: "))["error"]
        assert "timed out" in error["message"] and "127.0.0.1" not in error["message"]
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'latgate_requests_total{code="504",model="other",provider="up0"} 1.0' in metrics


def test_keep_alives_off_hold_the_head_until_content_as_before() -> None:
    with replay_server(silent(STREAM)) as stuck, gateway(config(stuck.base_url, keepalive=0, ftt=0.5)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=10)
        assert r.status_code == 504 and r.json()["error"]["type"]


def releasing_client(http: ModuleType, upstream: ReplayServer, marker: bytes) -> object:
    """A ``Client`` of ``http`` (httpx, or the anthropic SDK's httpx2) that releases a
    silent ``upstream`` once a response body carried ``marker`` (a keep-alive)."""

    class Watched(http.SyncByteStream):
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __iter__(self) -> Iterator[bytes]:
            tail = b""
            for chunk in self.inner:
                if marker in tail + chunk:
                    upstream.release.set()
                tail = chunk[-len(marker) :]
                yield chunk

        def close(self) -> None:
            self.inner.close()

    class Releasing(http.HTTPTransport):
        def handle_request(self, request: object) -> object:
            response = super().handle_request(request)
            response.stream = Watched(response.stream)
            return response

    return http.Client(transport=Releasing(), timeout=10)


def test_openai_sdk_reads_a_stream_that_began_with_keep_alives() -> None:
    with replay_server(silent(STREAM)) as up, gateway(config(up.base_url)) as gw:
        http = releasing_client(httpx, up, KEEPALIVE)
        client = openai.OpenAI(base_url=gw.v1, api_key="x", max_retries=0, http_client=http)
        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello world"
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_anthropic_sdk_reads_pings_then_the_message() -> None:
    with replay_server(silent(STREAM)) as up, gateway(config(up.base_url)) as gw:
        http = releasing_client(httpx2, up, PING)
        client = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0, http_client=http)
        with client.messages.stream(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as stream:
            text = "".join(stream.text_stream)
            message = stream.get_final_message()
        assert text == "Hello world" and message.stop_reason == "end_turn"


def test_anthropic_stream_failing_after_pings_ends_with_an_anthropic_error_event() -> None:
    with replay_server(silent(STREAM)) as stuck, gateway(config(stuck.base_url, ftt=0.5)) as gw:
        body = {"model": "m", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(gw.url + "/v1/messages", json=body, timeout=10)
        assert r.status_code == 200 and r.content.startswith(PING)
        assert r.content.replace(PING, b"").startswith(b"event: error\n")


def test_responses_stream_keeps_alive_with_comments() -> None:
    with replay_server(silent(STREAM)) as up, gateway(config(up.base_url)) as gw:
        body = {"model": "m", "input": "hi", "stream": True}
        with httpx.stream("POST", gw.v1 + "/responses", json=body, timeout=10) as r:
            received = read_until(r, lambda count: up.release.set())
        assert received.startswith(KEEPALIVE)
        assert b"response.completed" in received


def _keepalive_config(*, default: float = 15.0, provider: float | None = None, policy: float | None = None) -> Config:
    endpoint = EndpointConfig(id="p-0", api_base="http://127.0.0.1:9/v1")
    return Config(
        defaults=DefaultsConfig(first_token_keepalive_sec=default),
        providers={"p": ProviderConfig(name="p", endpoints=(endpoint,), first_token_keepalive_sec=provider)},
        routing=RoutingConfig(default_route="p", policies={"slow": PolicyConfig(first_token_keepalive_sec=policy)}),
    )


@pytest.mark.parametrize(
    ("default", "provider", "policy", "headers", "expected"),
    [
        (15.0, None, None, {}, 15.0),
        (15.0, 5.0, None, {}, 5.0),
        (15.0, 5.0, 2.0, {"x-route-policy": "slow"}, 2.0),
        (15.0, 5.0, None, {"x-route-policy": "slow"}, 5.0),
        (15.0, 0.0, None, {}, 0.0),
        (0.0, None, None, {}, 0.0),
    ],
)
def test_the_interval_is_the_policys_else_the_providers_else_the_defaults(
    default: float, provider: float | None, policy: float | None, headers: dict, expected: float
) -> None:
    config = _keepalive_config(default=default, provider=provider, policy=policy)
    decision = Router(config).decide({"model": "m", "messages": []}, headers)
    assert keepalive_seconds(config, decision) == expected
