"""Faults, one row each: what the client sees, and that nothing is left behind.

Every row runs a primary provider with a scripted fault and, where the row says so, a
healthy backup behind it (``fallbacks``). For each: the client gets a clear outcome
(a retry or fallback when nothing was sent yet; an error event and no ``[DONE]`` after
output began; text never duplicated), ``latgate_in_flight_requests`` is back to 0, and
a broken or stalled upstream connection is closed by the gateway.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass

import httpx
import pytest
from replay import ReplayScript, load_stream, replay_server, split_points
from stack import gateway, leave_after_first_content

STREAM = load_stream("vllm_chat")
EVENTS = split_points(STREAM, "events")
BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}
ERROR_FIRST = b'data: {"error": {"message": "engine overloaded", "type": "server_error", "code": 503}}\n\n'

CONFIG = """
[defaults]
timeout_sec = {read_timeout}
connect_timeout_sec = 1
first_token_timeout_sec = 0.5
max_retries = {retries}

[providers.primary]
api_base = "{primary}"

[providers.backup]
api_base = "{backup}"

[routing]
default_route = "primary"
{fallbacks}
"""


@dataclass(frozen=True)
class Fault:
    scripts: list[ReplayScript] | ReplayScript
    status: int  # what the client gets
    outcome: (
        str  # "backup" (answered by the fallback), "error" (envelope), "broken" (error event after output)
    )
    retries: int = 1
    fallback: bool = True
    closes_upstream: bool = False  # the gateway must close the primary's connection
    refused: bool = False  # the primary's port has no listener
    read_timeout: float = 10


def json_error(status: int, *, retry_after: str | None = None) -> ReplayScript:
    headers = [("retry-after", retry_after)] if retry_after else []
    return ReplayScript.json_response(
        status, {"error": {"message": f"status {status}", "type": "server_error"}}, headers=headers
    )


FAULTS = {
    "refused, with a fallback": Fault(ReplayScript.sse(STREAM), 200, "backup", refused=True),
    "refused, alone": Fault(ReplayScript.sse(STREAM), 502, "error", refused=True, fallback=False),
    "no headers before the first-token deadline": Fault(
        ReplayScript(stall_before_headers=True), 200, "backup", closes_upstream=True
    ),
    "no first token before the deadline": Fault(
        ReplayScript.sse(STREAM[: EVENTS[0]], end="stall"), 200, "backup", closes_upstream=True
    ),
    "no first token, alone": Fault(
        ReplayScript.sse(STREAM[: EVENTS[0]], end="stall"), 504, "error", fallback=False, closes_upstream=True
    ),
    "dies mid-stream": Fault(
        ReplayScript.sse(STREAM[: EVENTS[4]], split_at=EVENTS[:4], end="drop"), 200, "broken"
    ),
    "reset mid-stream": Fault(
        ReplayScript.sse(STREAM[: EVENTS[4]], split_at=EVENTS[:4], end="reset", pause_ms=20), 200, "broken"
    ),
    "stalls between chunks": Fault(
        ReplayScript.sse(STREAM[: EVENTS[4]], split_at=EVENTS[:4], end="stall"),
        200,
        "broken",
        closes_upstream=True,
        read_timeout=0.5,
    ),
    "429 then fine": Fault([json_error(429, retry_after="0"), ReplayScript.sse(STREAM)], 200, "primary"),
    "429 asking for a long pause": Fault(json_error(429, retry_after="60"), 200, "backup"),
    "429, alone": Fault(json_error(429, retry_after="0"), 429, "error", fallback=False),
    "503 then fine": Fault([json_error(503), ReplayScript.sse(STREAM)], 200, "primary"),
    "500 every time": Fault(json_error(500), 200, "backup"),
    "502, alone": Fault(json_error(502), 502, "error", fallback=False),
    "error event first in a 200 stream": Fault(ReplayScript.sse(ERROR_FIRST), 200, "backup"),
    "error event first, alone": Fault(ReplayScript.sse(ERROR_FIRST), 502, "error", fallback=False),
}


def fault_config(fault: Fault, primary: str, backup: str) -> str:
    return CONFIG.format(
        primary=primary,
        backup=backup,
        retries=fault.retries,
        read_timeout=fault.read_timeout,
        fallbacks='fallbacks = { primary = ["backup"] }' if fault.fallback else "",
    )


def in_flight(metrics: str, provider: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(f'latgate_in_flight_requests{{provider="{provider}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("name", list(FAULTS))
def test_fault_gives_a_clear_outcome_and_leaves_nothing_behind(name: str) -> None:
    fault = FAULTS[name]
    with replay_server(ReplayScript.sse(STREAM)) as backup, replay_server(fault.scripts) as primary:
        primary_url = primary.base_url
        if fault.refused:
            primary.stop()  # its port now refuses connections
        with gateway(fault_config(fault, primary_url, backup.base_url)) as gw:
            r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=15)
            metrics = httpx.get(gw.url + "/metrics").text
        if fault.closes_upstream:
            assert primary.client_closed.wait(5), "the stalled upstream connection was left open"
    assert r.status_code == fault.status, r.text
    if fault.outcome in ("backup", "primary"):
        assert r.content == STREAM  # one clean stream, nothing from the failed attempt
        assert r.headers["x-latgate-provider"] == fault.outcome
        if fault.outcome == "backup":
            assert r.headers["x-latgate-route-reason"] == "fallback:primary"
    elif fault.outcome == "error":
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert r.headers["x-should-retry"] == "true"
        if fault.status == 429:
            assert r.headers["retry-after"] == "0"
    else:  # output began: the events so far, once, then one error event and no [DONE]
        head = STREAM[: EVENTS[3]]
        assert r.content.startswith(head)
        tail = r.content[len(head) :]
        events = [e for e in tail.split(b"\n\n") if e]
        assert events[-1].startswith(b"data: ") and json.loads(events[-1][6:])["error"]["type"] == "api_error"
        assert b"[DONE]" not in r.content
        assert r.content.count(STREAM[EVENTS[1] : EVENTS[2]]) == 1
    assert in_flight(metrics, "primary") == 0.0 and in_flight(metrics, "backup") == 0.0


def test_client_disconnecting_mid_stream_closes_the_upstream_and_counts_a_499() -> None:
    script = ReplayScript.sse(STREAM[: EVENTS[3]], split_at=EVENTS[:3], end="stall")
    with (
        replay_server(script) as primary,
        replay_server(ReplayScript.sse(STREAM)) as backup,
        gateway(fault_config(FAULTS["dies mid-stream"], primary.base_url, backup.base_url)) as gw,
    ):
        leave_after_first_content(gw.v1 + "/chat/completions", BODY)
        assert primary.client_closed.wait(5)
        metrics = httpx.get(gw.url + "/metrics").text
    assert 'latgate_requests_total{code="499",model="other",provider="primary"} 1.0' in metrics
    assert in_flight(metrics, "primary") == 0.0


def test_client_disconnecting_mid_request_sends_nothing_upstream_and_logs_no_internal_error(caplog) -> None:
    caplog.set_level(logging.INFO)
    with (
        replay_server(ReplayScript.sse(STREAM)) as primary,
        replay_server(ReplayScript.sse(STREAM)) as backup,
    ):
        with gateway(fault_config(FAULTS["dies mid-stream"], primary.base_url, backup.base_url)) as gw:
            port = int(gw.url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                    b"content-length: 5000\r\n\r\n" + json.dumps(BODY).encode()[:20]
                )
            r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)  # still serving
            metrics = httpx.get(gw.url + "/metrics").text
        assert r.status_code == 200
        assert len(primary.requests) == 1  # only the second, whole request went upstream
    assert in_flight(metrics, "primary") == 0.0
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], [
        rec.getMessage() for rec in caplog.records
    ]


@pytest.mark.parametrize(("sent", "passed_on"), [("99999999999999999999", "3600"), ("1e309", None), ("-5", "0"), ("2.5", "2.5")])
def test_an_upstream_retry_after_is_passed_on_within_bounds(sent: str, passed_on: str | None) -> None:
    """As sent when it is 0 .. 3600 s, else bounded; a value that is not a finite number is dropped."""
    fault = Fault(json_error(429, retry_after=sent), 429, "error", fallback=False, retries=0)
    with (
        replay_server(ReplayScript.sse(STREAM)) as backup, replay_server(fault.scripts) as primary,
        gateway(fault_config(fault, primary.base_url, backup.base_url)) as gw,
    ):
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=15)
    assert r.status_code == 429
    assert r.headers.get("retry-after") == passed_on
