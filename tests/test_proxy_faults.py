"""Upstream stream faults and client disconnects: each ends with a clear outcome for the
client, leaks nothing and holds no upstream connection (found by adversarial testing)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from completions import DONE, ROLE, chat_chunk, content, event
from replay import ReplayScript, replay_server
from stack import gateway

from latgate.forwarding.sse import StreamTap

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
SECRET = "sk-QA-provider-secret-4242"


def config(base: str, *, retries: int = 1, ftt: float = 5, timeout: float = 10, extra: str = "") -> str:
    return (
        f"[defaults]\ntimeout_sec = {timeout}\nconnect_timeout_sec = 2\nfirst_token_timeout_sec = {ftt}\n"
        f'max_retries = {retries}\n[providers.up]\napi_base = "{base}"\napi_key_env = "UP_KEY"\n{extra}'
    )


GOOD = ROLE + content("ok") + DONE


def metric_lines(url: str, prefix: str) -> list[str]:
    return [line for line in httpx.get(url + "/metrics").text.splitlines() if line.startswith(prefix)]


# --- before the first byte: a 200 without content is not a success -----------------------


@pytest.mark.parametrize("first", [b"", ROLE], ids=["empty_body", "role_chunk_only"])
def test_a_200_stream_that_ends_before_any_content_is_retried(first: bytes) -> None:
    """A 200 stream that ends before any content (empty, or a role chunk only) is a
    failure before the first byte (docs/routing.md): the next attempt is made and the
    client gets its answer, never an empty stream without an error or [DONE]."""
    with replay_server([ReplayScript.sse(first), ReplayScript.sse(GOOD)]) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=15)
        assert len(up.requests) == 2, f"not retried; client got {r.status_code} {r.content!r}"
        assert r.status_code == 200 and b'"ok"' in r.content


def test_an_html_200_for_a_stream_is_not_relayed_as_a_successful_stream() -> None:
    """A captive portal / misconfigured proxy answering 200 text/html: relayed verbatim
    as a 200 (internal URL included) and counted as a healthy success."""
    html = ReplayScript(
        status=200,
        headers=(("content-type", "text/html"),),
        body_pieces=(b"<html><body>Sign in at http://10.0.0.1/sso</body></html>",),
        framing="content-length",
    )
    with replay_server([html, html]) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=15)
        assert r.status_code >= 500, r.content
        assert b"10.0.0.1" not in r.content


@pytest.mark.parametrize(
    ("path", "request_body"),
    [
        ("/chat/completions", {**BODY, "stream": False}),
        ("/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
        ("/responses", {"model": "m", "input": "hi"}),
    ],
)
def test_a_non_streamed_request_answered_with_an_event_stream_is_the_providers_failure(path: str, request_body: dict) -> None:
    """Only a JSON object answers a non-streamed request: an event stream (here echoing
    latgate's provider key) is never relayed, counted as the provider's bad response."""
    sse = ReplayScript.sse(content(f"Bearer {SECRET}") + DONE)
    with replay_server([sse, sse]) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        r = httpx.post(gw.v1 + path, json=request_body, timeout=15)
        errors = metric_lines(gw.url, "latgate_upstream_errors_total")
    assert r.status_code == 502, r.content
    assert SECRET.encode() not in r.content
    assert ("type" in r.json() and r.json()["type"] == "error") if path == "/messages" else "error" in r.json()
    assert any('kind="bad_response"' in line for line in errors)


# --- after the first byte -------------------------------------------------------------------


def _error_after_content_stream() -> ReplayScript:
    head = ROLE + content("Hel") + content("lo")
    err = event({"error": {"message": f"engine crashed (auth Bearer {SECRET}); see http://10.1.2.3:8000/debug", "type": "server_error"}})
    return ReplayScript.sse(head + err, split_at=[len(ROLE), len(head)], pause_ms=50)


def test_an_error_event_after_content_does_not_leak_the_provider_key_or_internal_urls() -> None:
    """The first-event error path scrubs URLs and the key; the same event after content
    is relayed raw."""
    with replay_server(_error_after_content_stream()) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=15)
        assert b'"Hel"' in r.content and b'"lo"' in r.content
        assert SECRET.encode() not in r.content
        assert b"10.1.2.3" not in r.content


def test_an_error_event_after_content_is_counted_as_a_broken_stream() -> None:
    """docs/metrics.md: code 502 on a stream means the upstream broke after output began. An
    in-band error event mid-stream is recorded as a clean 200 with no upstream error."""
    with replay_server(_error_after_content_stream()) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=15)
        requests = metric_lines(gw.url, "latgate_requests_total")
        assert 'latgate_requests_total{code="502",model="other",provider="up"} 1.0' in requests, requests
        assert metric_lines(gw.url, "latgate_upstream_errors_total"), "no upstream error recorded"


def test_the_response_ends_at_done_even_if_the_upstream_keeps_the_connection_open() -> None:
    """After [DONE] latgate keeps reading until timeout_sec, then appends an error event
    *after* [DONE] and records a 502 for a complete answer."""
    with replay_server(ReplayScript.sse(GOOD, end="stall")) as up, gateway(config(up.base_url, timeout=6), env={"UP_KEY": SECRET}) as gw:
        started = time.monotonic()
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=15)
        elapsed = time.monotonic() - started
        up.release.set()
        assert r.content.endswith(b"data: [DONE]\n\n"), r.content[-200:]
        assert elapsed < 3, f"response ended {elapsed:.1f}s after the upstream sent [DONE]"


# --- deadlines -----------------------------------------------------------------------------


def test_an_error_status_whose_body_stalls_fails_over_within_the_first_token_deadline() -> None:
    """The first-token deadline covers the headers only; the error body of a 503 is read
    under timeout_sec, so failover waits timeout_sec (default 600 s) instead of ftt."""
    stalled_503 = ReplayScript(status=503, headers=(("content-type", "application/json"),), body_pieces=(b'{"error":',), framing="content-length", end="stall")
    with replay_server([stalled_503, ReplayScript.sse(GOOD)]) as up, gateway(config(up.base_url, ftt=0.5, timeout=8), env={"UP_KEY": SECRET}) as gw:
        started = time.monotonic()
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=20)
        elapsed = time.monotonic() - started
        up.release.set()
        assert r.status_code == 200
        assert elapsed < 3, f"failover took {elapsed:.1f}s with first_token_timeout_sec = 0.5"


# --- client goes away before the first token --------------------------------------------------


def assert_leaving_before_the_first_token_closes_the_upstream(path: str, body: dict) -> None:
    """POST ``body`` to ``path`` on a raw connection to a gateway in front of an upstream that
    never answers, and leave once the upstream got it: within 3 s the gateway must close
    its upstream connection, and count no request in flight."""
    with replay_server(ReplayScript(stall_before_headers=True)) as up, gateway(config(up.base_url, retries=0, ftt=60, timeout=60), env={"UP_KEY": SECRET}) as gw:
        raw = json.dumps(body).encode()
        host, port = gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(raw), raw))
            assert up.request_seen.wait(5), "the request never reached the upstream"
        closed = up.client_closed.wait(3)
        in_flight = metric_lines(gw.url, "latgate_in_flight_requests")
        up.release.set()
        assert closed, "upstream connection still open 3 s after the client left"
        assert 'latgate_in_flight_requests{provider="up"} 0.0' in in_flight, in_flight


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non_stream"])
def test_client_leaving_before_the_first_token_closes_the_upstream(stream: bool) -> None:
    """Only StreamRelay watches for disconnect; while latgate waits for the upstream's
    headers / first token (or a whole non-streamed answer) an abandoned request keeps the
    upstream generating and the in-flight gauge up until timeout_sec."""
    assert_leaving_before_the_first_token_closes_the_upstream("/v1/chat/completions", {**BODY, "stream": stream})


# --- the SSE tap --------------------------------------------------------------------------


def test_sse_tap_grows_one_buffer_in_place_for_an_event_split_over_many_reads() -> None:
    """An event split over many reads is assembled in one ``bytearray`` grown in place
    (linear in its size, not re-joined on every read): the same buffer object holds
    exactly the bytes fed so far, and the event comes out whole and unchanged."""
    data = b'data: {"choices":[{"delta":{"content":"' + b"x" * (4 << 20) + b'"}}]}\n\n'
    reads = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    tap = StreamTap()
    assert tap.feed(reads[0]) == (b"", 0)
    buffer = tap._pending
    fed = len(reads[0])
    for piece in reads[1:-1]:
        assert tap.feed(piece) == (b"", 0)
        fed += len(piece)
        assert tap._pending is buffer, "the partial event was copied into a new buffer"
        assert len(buffer) == fed
    assert tap.feed(reads[-1]) == (data, 1)
    assert tap.events == 1 and tap._pending == b""


# --- upstream-reported usage ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non_stream"])
def test_negative_usage_from_the_upstream_still_finishes_the_request_record(stream: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Exchange.apply_usage takes any int; Counter.inc(-5) raises ValueError inside
    Exchange.finish: uvicorn logs 'Exception in ASGI application' with a traceback and the
    access line (and the token counters) for the request are lost."""
    usage = {"prompt_tokens": -5, "completion_tokens": -3, "total_tokens": -8}
    if stream:
        script = ReplayScript.sse(ROLE + content("ok") + event(chat_chunk(usage=usage)) + DONE)
    else:
        answer = {"id": "c", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}], "usage": usage}
        script = ReplayScript.json_response(200, answer)
    caplog.set_level("INFO", logger="latgate.access")
    with replay_server(script) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json={**BODY, "stream": stream, "stream_options": {"include_usage": True}} if stream else {**BODY, "stream": False}, timeout=10)
        assert r.status_code == 200
    # leaving the block stopped the server, which runs the response's background task first
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "latgate.access"]
    assert len(lines) == 1, "no access log line: Exchange.finish raised"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"model": "m", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"model": "m", "stream": True, "input": "hi"}),
    ],
    ids=["anthropic", "responses"],
)
def test_client_leaving_a_translated_api_before_the_first_token_closes_the_upstream(path: str, body: dict) -> None:
    assert_leaving_before_the_first_token_closes_the_upstream(path, body)
