"""Stream irregularities replayed byte-exactly by a replay upstream, through the gateway.

Every recorded stream must reach the client unchanged (the client asks for usage, so
latgate edits nothing), whatever the read splits, except that a stream whose choices all
finished gets the ``[DONE]`` its upstream left out; failures before the first byte are
retried, failures after it end the stream with an error event and no ``[DONE]``.
"""

from __future__ import annotations

import json

import httpx
import pytest
from replay import ReplayScript, load_expect, load_stream, replay_server, split_points, stream_fixture_names
from sse_tap import as_forwarded
from stack import gateway, leave_after_first_content

CONFIG = """
[defaults]
timeout_sec = 10
connect_timeout_sec = 2
first_token_timeout_sec = {ftt}
max_retries = {retries}

[providers.up]
api_base = "{base}"
"""

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": {"include_usage": True}}
CLEAN = [n for n in stream_fixture_names() if n != "error_first_event"]


def config(base: str, *, retries: int = 0, ftt: float = 5) -> str:
    return CONFIG.format(base=base, retries=retries, ftt=ftt)


@pytest.mark.parametrize("how", ["events", "bytes", "utf8"])
@pytest.mark.parametrize("name", CLEAN)
def test_recorded_stream_reaches_the_client_unchanged(name: str, how: str) -> None:
    body = load_stream(name)
    points = split_points(body, how)
    if how == "bytes":
        points = points[:: max(1, len(points) // 40)]  # ~40 reads: enough to split inside events
    script = ReplayScript.sse(body, split_at=points)
    with replay_server(script) as upstream, gateway(config(upstream.base_url)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        expect = load_expect(name)
        assert r.status_code == 200
        forwarded = as_forwarded(body)  # comments as a bare ":"
        assert r.content == (forwarded if expect.done else forwarded + b"data: [DONE]\n\n")
        assert r.headers["content-type"].startswith("text/event-stream")
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'latgate_requests_total{code="200",model="other",provider="up"} 1.0' in metrics
        if expect.usage:
            assert f'latgate_completion_tokens_total{{model="other",outcome="ok",provider="up"}} {float(expect.usage["completion_tokens"])}' in metrics
        else:
            assert f'latgate_completion_tokens_total{{model="other",outcome="ok",provider="up"}} {float(expect.content_chunks)}' in metrics


@pytest.mark.parametrize("framing", ["content-length", "close"])
def test_streams_framed_by_length_or_close_are_relayed(framing: str) -> None:
    body = load_stream("vllm_chat")
    script = ReplayScript.sse(body, split_at=split_points(body, "events"), framing=framing)
    with replay_server(script) as upstream, gateway(config(upstream.base_url)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert r.content == body


@pytest.mark.parametrize(("api_base", "path"), [("", "/v1/chat/completions"), ("/v1", "/v1/chat/completions"), ("/v1/", "/v1/chat/completions"), ("/api", "/api/v1/chat/completions")])
def test_api_base_with_or_without_version_reaches_one_v1(api_base: str, path: str) -> None:
    script = ReplayScript.sse(load_stream("vllm_chat"))
    with replay_server(script) as upstream:
        root = upstream.base_url.removesuffix("/v1")
        with gateway(config(root + api_base)) as gw:
            assert httpx.post(gw.v1 + "/chat/completions", json=BODY).status_code == 200
        assert upstream.requests[0].path == path


def test_503_then_stream_is_retried_and_the_client_sees_one_clean_stream() -> None:
    body = load_stream("vllm_chat")
    scripts = [ReplayScript.json_response(503, {"error": {"message": "overloaded", "type": "server_error"}}), ReplayScript.sse(body)]
    with replay_server(scripts) as upstream, gateway(config(upstream.base_url, retries=1)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert r.status_code == 200 and r.content == body
        assert len(upstream.requests) == 2


def test_client_error_as_first_event_of_a_200_stream_is_a_400_not_retried() -> None:
    bad = ReplayScript.sse(load_stream("error_first_event"))  # context too long (code 400)
    with replay_server([bad, bad]) as upstream, gateway(config(upstream.base_url, retries=1)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert len(upstream.requests) == 1
        assert r.status_code == 400
        assert "maximum context length" in r.json()["error"]["message"]


def test_server_error_as_first_event_of_a_200_stream_is_retried_then_reported() -> None:
    crash = b'data: {"error": {"message": "engine died", "type": "server_error", "code": 500}}\n\n'
    bad = ReplayScript.sse(crash)
    with replay_server([bad, bad]) as upstream, gateway(config(upstream.base_url, retries=1)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert len(upstream.requests) == 2
        assert r.status_code == 502
        error = r.json()["error"]
        assert error["type"] == "api_error" and "engine died" in error["message"]
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'latgate_upstream_errors_total{kind="error_event",provider="up"} 2.0' in metrics


def test_upstream_dying_mid_stream_ends_with_an_error_event_and_no_done() -> None:
    body = load_stream("vllm_chat")
    events = split_points(body, "events")
    script = ReplayScript.sse(body[: events[4]], split_at=events[:4], end="drop")
    with replay_server(script) as upstream, gateway(config(upstream.base_url, retries=2)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert r.status_code == 200
        assert r.content.startswith(body[: events[4]])
        tail = r.content[events[4]:]
        assert tail.startswith(b"data: ") and b"[DONE]" not in tail
        assert json.loads(tail[6:])["error"]["type"] == "api_error"
        assert len(upstream.requests) == 1  # never retried after output began
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'latgate_in_flight_requests{provider="up"} 0.0' in metrics


def test_connection_refused_gives_a_502_envelope_without_the_address() -> None:
    with replay_server(ReplayScript.sse(b"")) as upstream:
        dead = upstream.base_url
    with gateway(config(dead, retries=1)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "upstream_unavailable"
        assert "127.0.0.1" not in r.text
        assert r.headers["x-should-retry"] == "true"


def test_stalled_upstream_hits_the_first_token_deadline_and_the_connection_is_closed() -> None:
    script = ReplayScript(stall_before_headers=True)
    with replay_server(script) as upstream, gateway(config(upstream.base_url, ftt=0.3)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert r.status_code in (502, 504)
        assert upstream.client_closed.wait(5)


def test_stall_after_headers_hits_the_first_token_deadline() -> None:
    body = load_stream("vllm_chat")
    first = split_points(body, "events")[0]
    script = ReplayScript.sse(body[:first], end="stall")  # the role chunk only, then silence
    with replay_server(script) as upstream, gateway(config(upstream.base_url, ftt=0.3)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "upstream_timeout"
        assert upstream.client_closed.wait(5)


def test_client_closing_mid_stream_closes_the_upstream_connection() -> None:
    body = load_stream("vllm_chat")
    events = split_points(body, "events")
    script = ReplayScript.sse(body[: events[3]], split_at=events[:3], end="stall")
    with replay_server(script) as upstream, gateway(config(upstream.base_url)) as gw:
        leave_after_first_content(gw.v1 + "/chat/completions", BODY)
        assert upstream.client_closed.wait(5)


def test_upstream_4xx_is_passed_back_with_its_status_and_not_retried() -> None:
    err = {"error": {"message": "This model's maximum context length is 8192 tokens", "type": "BadRequestError", "param": None, "code": 400}}
    with replay_server(ReplayScript.json_response(400, err)) as upstream, gateway(config(upstream.base_url, retries=2)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert r.status_code == 400
        assert "maximum context length" in r.json()["error"]["message"]
        assert len(upstream.requests) == 1
        assert r.headers["x-should-retry"] == "false"


def test_upstream_401_names_the_missing_key_variable_in_the_log_not_to_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = config("{base}") + 'api_key_env = "UP_KEY"\n'
    with (
        caplog.at_level("WARNING", logger="latgate.upstream"),
        replay_server(ReplayScript.json_response(401, {"error": {"message": "bad key"}})) as upstream,
        gateway(text.replace("{base}", upstream.base_url)) as gw,
    ):
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY)
    assert r.status_code == 502
    assert "UP_KEY" not in r.text
    assert any("UP_KEY is not set" in record.getMessage() for record in caplog.records)


def test_extra_body_fields_are_added_only_where_the_client_did_not_set_them() -> None:
    text = config("{base}") + 'extra_body = { top_k = 1, repetition_penalty = 1.05 }\n'
    with replay_server(ReplayScript.sse(load_stream("vllm_chat"))) as upstream:
        with gateway(text.replace("{base}", upstream.base_url)) as gw:
            httpx.post(gw.v1 + "/chat/completions", json={**BODY, "top_k": 5})
        sent = upstream.requests[0].json()
        assert sent["top_k"] == 5 and sent["repetition_penalty"] == 1.05


def test_an_upstream_echoing_latgates_key_in_its_error_never_shows_it_to_the_client() -> None:
    secret = "sk-echo-secret-999"
    echo = {"error": {"message": f"upstream rejected key Bearer {secret} (raw {secret})", "type": "invalid_request_error"}}
    text = config("{base}") + 'api_key_env = "UP_KEY"\n'
    with replay_server(ReplayScript.json_response(400, echo)) as upstream:
        with gateway(text.replace("{base}", upstream.base_url), env={"UP_KEY": secret}) as gw:
            r = httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert upstream.requests[0].header("authorization") == f"Bearer {secret}"
    assert r.status_code == 400
    assert secret not in r.text and "<redacted>" in r.text
