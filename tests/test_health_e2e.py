"""Health end to end: client-caused errors never count against a backend; server errors
eject it; /readyz and latgate_provider_healthy show it."""

from __future__ import annotations

import logging

import httpx
import pytest
from replay import ReplayScript, replay_server
from stack import gateway

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False}
CONFIG = '[defaults]\nmax_retries = 0\n[providers.p]\napi_base = "{url}"\n[health]\nprobe_interval_sec = 0\n'


def endpoint_view(gw) -> dict:
    return httpx.get(gw.url + "/admin/providers").json()["providers"]["p"]["endpoints"][0]


@pytest.mark.parametrize(
    "status, error",
    [
        (400, {"message": "This model's maximum context length is 8192 tokens", "type": "BadRequestError", "code": 400}),
        (404, {"message": "The model `x` does not exist.", "type": "NotFoundError", "code": 404}),
        (422, {"message": "messages: field required", "type": "invalid_request_error"}),
    ],
)
def test_client_errors_never_count_against_the_backend(status: int, error: dict) -> None:
    answer = ReplayScript.json_response(status, {"error": error})
    with replay_server(answer) as upstream, gateway(CONFIG.format(url=upstream.base_url)) as gw:
        for _ in range(8):
            assert httpx.post(gw.v1 + "/chat/completions", json=BODY).status_code == status
        view = endpoint_view(gw)
        assert view["circuit"] == "closed" and view["consecutive_failures"] == 0 and view["failures"] == 0
        assert httpx.get(gw.url + "/readyz").status_code == 200


def test_a_context_too_long_error_event_in_a_stream_does_not_count_either() -> None:
    event = b'data: {"error": {"message": "maximum context length exceeded", "type": "BadRequestError", "code": 400}}\n\n'
    with replay_server(ReplayScript.sse(event)) as upstream, gateway(CONFIG.format(url=upstream.base_url)) as gw:
        for _ in range(6):
            assert httpx.post(gw.v1 + "/chat/completions", json={**BODY, "stream": True}).status_code == 400
        assert endpoint_view(gw)["circuit"] == "closed"


def test_server_errors_eject_the_backend_and_readyz_and_the_gauge_say_so() -> None:
    down = ReplayScript.json_response(503, {"error": {"message": "overloaded"}})
    with replay_server(down) as upstream, gateway(CONFIG.format(url=upstream.base_url)) as gw:
        for _ in range(5):
            assert httpx.post(gw.v1 + "/chat/completions", json=BODY).status_code == 503
        view = endpoint_view(gw)
        assert view["circuit"] == "open" and view["circuit_reason"] == "errors" and view["reopens_in_seconds"] > 0
        ready = httpx.get(gw.url + "/readyz")
        assert ready.status_code == 503 and ready.json()["available_endpoints"] == {"p": 0}
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'latgate_provider_healthy{endpoint="p-0",provider="p"} 0.0' in metrics
        assert 'latgate_ejections_total{endpoint="p-0",provider="p",reason="errors"} 1.0' in metrics


def test_a_lone_ejected_endpoint_is_still_tried_rather_than_refusing_the_request() -> None:
    script = [ReplayScript.json_response(503, {"error": {"message": "down"}})] * 5 + [
        ReplayScript.json_response(200, {"id": "x", "object": "chat.completion", "choices": []})
    ]
    with replay_server(script) as upstream, gateway(CONFIG.format(url=upstream.base_url)) as gw:
        for _ in range(5):
            httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert httpx.post(gw.v1 + "/chat/completions", json=BODY).status_code == 200
        assert endpoint_view(gw)["circuit"] == "closed", "the success closed it again"


def test_a_request_failing_while_every_endpoint_is_out_says_why_in_its_error_and_access_log(caplog) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    down = ReplayScript.json_response(503, {"error": {"message": "overloaded"}})
    with replay_server(down) as upstream, gateway(CONFIG.format(url=upstream.base_url)) as gw:
        for _ in range(5):
            first = httpx.post(gw.v1 + "/chat/completions", json=BODY)
            assert "out of service" not in first.json()["error"]["message"], "it was in service then"
        assert endpoint_view(gw)["circuit"] == "open"
        response = httpx.post(gw.v1 + "/chat/completions", json=BODY)
        assert response.status_code == 503
        assert "every endpoint of p is out of service" in response.json()["error"]["message"]
        assert '"cause":"every endpoint of p is out of service' in caplog.text
