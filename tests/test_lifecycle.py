"""``latgate serve`` stopping like a production service: SIGTERM drains streams in flight
within the drain timeout, refuses new connections at once, and exits 0; JSON logs."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from gateway_process import GatedUpstream, GatewayProcess
from servers import serve_app

STREAM_BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def write_config(tmp_path, upstream_url: str, *, extra: str = "") -> str:
    path = tmp_path / "config.toml"
    path.write_text(f'[providers.gated]\napi_base = "{upstream_url}/v1"\n{extra}')
    return str(path)


@pytest.fixture
def upstream():
    gated = GatedUpstream()
    with serve_app(gated) as url:
        try:
            yield gated, url
        finally:
            gated.gate.set()


def open_stream(client: httpx.Client, url: str):
    """Start a stream and read up to its first token; returns (response, lines iterator, lines read)."""
    request = client.build_request("POST", url + "/v1/chat/completions", json=STREAM_BODY)
    response = client.send(request, stream=True)
    assert response.status_code == 200
    lines = response.iter_lines()
    seen = []
    for line in lines:
        seen.append(line)
        if '"one"' in line:
            return response, lines, seen
    raise AssertionError(f"stream ended before its first token: {seen}")


@contextlib.contextmanager
def serving(
    tmp_path, upstream_url: str, *, drain_timeout_seconds: float
) -> Iterator[tuple[GatewayProcess, str]]:
    """``latgate serve`` in front of ``upstream_url`` with this drain timeout, stopped on
    exit; yields (process, base URL) once it listens."""
    drain = ["--drain-timeout", str(drain_timeout_seconds)]
    gw = GatewayProcess(["--config", write_config(tmp_path, upstream_url), "--port", "0", *drain])
    try:
        yield gw, gw.wait_listening()
    finally:
        gw.stop()


def test_sigterm_lets_a_stream_in_flight_finish_and_refuses_new_connections(tmp_path, upstream) -> None:
    gated, upstream_url = upstream
    drain_timeout = 20.0
    with serving(tmp_path, upstream_url, drain_timeout_seconds=drain_timeout) as (gw, url):
        with httpx.Client(timeout=30) as client:
            response, lines, seen = open_stream(client, url)
            signalled_at = time.monotonic()
            gw.signal(signal.SIGTERM)
            gw.wait_for(r"draining: SIGTERM received, stopped accepting; 1 connection\(s\) open")
            with pytest.raises(httpx.ConnectError):
                httpx.get(url + "/healthz", timeout=5)
            assert gw.proc.poll() is None  # still serving the stream
            gated.gate.set()
            seen.extend(lines)
            response.close()
        assert [line for line in seen if line][-1] == "data: [DONE]"
        assert any('" two"' in line for line in seen)
        assert gw.wait_exit(timeout=drain_timeout) == 0
        assert time.monotonic() - signalled_at < drain_timeout
        assert any("drained in" in line for line in gw.lines)
        assert not any("Traceback" in line for line in gw.lines)


def test_drain_timeout_cuts_a_stream_that_does_not_finish_and_exits(tmp_path, upstream) -> None:
    _, upstream_url = upstream
    with serving(tmp_path, upstream_url, drain_timeout_seconds=0.5) as (gw, url):
        with httpx.Client(timeout=30) as client:
            response, lines, seen = open_stream(client, url)
            signalled_at = time.monotonic()
            gw.signal(signal.SIGTERM)
            seen.extend(lines)  # cut mid-stream: an error event, then the response ends
            response.close()
            assert gw.wait_exit(timeout=10) == 0
            elapsed = time.monotonic() - signalled_at
        assert "data: [DONE]" not in seen
        error = json.loads([line for line in seen if line][-1].removeprefix("data: "))["error"]
        assert error["code"] == "drain_timeout"
        assert 0.5 <= elapsed < 5
        assert any("drain timeout (0.5s) reached: 1 request(s)" in line for line in gw.lines)
        access = [json.loads(line.split(" latgate.access ", 1)[1]) for line in gw.lines if " latgate.access " in line]
        assert [(a["status"], a["error"]) for a in access] == [(503, "drain_timeout")]
        assert not any("Traceback" in line or "Exception in ASGI" in line for line in gw.lines), gw.lines


def test_second_ctrl_c_stops_without_waiting_for_the_stream(tmp_path, upstream) -> None:
    _, upstream_url = upstream
    with serving(tmp_path, upstream_url, drain_timeout_seconds=60) as (gw, url):
        with httpx.Client(timeout=30) as client:
            response, _, _ = open_stream(client, url)
            gw.signal(signal.SIGINT)
            gw.wait_for("draining: SIGINT received")
            gw.signal(signal.SIGINT)
            assert gw.wait_exit(timeout=10) == 0
            response.close()
        assert any("SIGINT again: exiting without waiting" in line for line in gw.lines)


def test_json_logs_carry_one_access_line_per_request_without_key_or_prompt(tmp_path, upstream) -> None:
    _, upstream_url = upstream
    secret = "sk-test-never-logged-3f9a"
    prompt = "a distinctive prompt that must stay out of logs"
    config = write_config(tmp_path, upstream_url, extra='api_key_env = "GATED_KEY"\nmodels = ["m"]\n')
    gw = GatewayProcess(
        ["--config", config, "--port", "0", "--log-format", "json"], env={"GATED_KEY": secret}
    )
    try:
        url = gw.wait_listening()
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
        r = httpx.post(
            url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "req-42"}, timeout=10
        )
        assert r.status_code == 200
        access = json.loads(gw.wait_for(r'"logger":"latgate\.access"').string)
        gw.signal(signal.SIGTERM)
        assert gw.wait_exit(timeout=20) == 0
    finally:
        gw.stop()
    records = [json.loads(line) for line in gw.lines]  # every line is one JSON object
    assert {"ts", "level", "logger", "pid"} <= set(records[0])
    assert access["request_id"] == "req-42"
    assert (access["provider"], access["endpoint"], access["model"], access["upstream_model"]) == (
        "gated",
        "gated-0",
        "m",
        "m",
    )
    assert access["reason"] == "default" and access["status"] == 200
    assert access["prompt_tokens"] == 1 and access["completion_tokens"] == 1
    assert access["e2e_ms"] > 0 and "ttft_ms" in access
    messages = [rec.get("message", "") for rec in records]
    assert any(m.startswith("provider gated: connector=openai") and "key=set" in m for m in messages)
    assert any(m.startswith("routes: ") for m in messages)
    assert not any(secret in line or prompt in line for line in gw.lines)


def test_drain_timeout_must_not_be_negative(tmp_path) -> None:
    gw = GatewayProcess(["--config", write_config(tmp_path, "http://127.0.0.1:9"), "--drain-timeout", "-1"])
    assert gw.wait_exit(timeout=30) == 2
    assert gw.lines == ["latgate: error: --drain-timeout must be >= 0 seconds"]
