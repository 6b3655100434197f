"""``/ui``: the page and its state endpoint through a real gateway (the browser test is
tests/browser/); what the state says about requests and events; the admin key."""

from __future__ import annotations

import httpx
import pytest
from stack import FAST, demo_stack, gateway, simulator_urls

from latgate.app.ui import Activity
from latgate.commands.sim import SimOptions
from latgate.forwarding.exchange import Exchange
from latgate.forwarding.recorder import Recorder
from latgate.foundation.metrics import Metrics

BODY = {"model": "glm-5.1", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_the_page_and_its_assets_are_served_from_the_package_with_no_outside_address() -> None:
    with demo_stack() as stack:
        page = httpx.get(stack.url + "/ui")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assets = {name: httpx.get(f"{stack.url}/ui/{name}") for name in ("ui.js", "ui.css")}
    assert all(r.status_code == 200 for r in assets.values())
    assert assets["ui.js"].headers["content-type"].startswith("text/javascript")
    for text in (page.text, *(r.text for r in assets.values())):
        assert "http://" not in text.replace("http://localhost", "") and "https://" not in text
        assert "//cdn" not in text


def test_state_lists_a_request_with_its_route_reason_and_timings_and_the_providers() -> None:
    with demo_stack() as stack:
        response = httpx.post(stack.v1 + "/chat/completions", json=BODY, headers={"X-Latency-Sensitive": "1"})
        assert response.status_code == 200
        state = httpx.get(stack.url + "/ui/state").json()
    assert set(state["providers"]) == set(stack.config.providers)
    (request,) = state["requests"]
    assert request["id"] == response.headers["x-request-id"]
    assert (request["provider"], request["reason"], request["status"]) == ("tile-rt", "latency_sensitive", 200)
    assert request["ttft_ms"] > 0 and request["e2e_ms"] >= request["ttft_ms"]
    assert request["completion_tokens"] > 1 and request["tokens_per_second"] > 0
    endpoint = state["providers"]["tile-rt"]["endpoints"][0]
    assert endpoint["ttft_model"]["observations"] == 1 and endpoint["circuit"] == "closed"


def test_fallbacks_and_retries_appear_as_events_once_each() -> None:
    failing = SimOptions(name="tile-rt", error_rate=1.0, seed=1, **FAST)
    with demo_stack(tile=failing) as stack:
        response = httpx.post(stack.v1 + "/chat/completions", json=BODY, headers={"X-Latency-Sensitive": "1"})
        assert response.status_code == 200 and response.headers["x-latgate-provider"] == "vllm"
        first = httpx.get(stack.url + "/ui/state").json()["events"]
        again = httpx.get(stack.url + "/ui/state").json()["events"]
    kinds = {(e["kind"], e["detail"]) for e in first}
    assert ("fallback", "tile-rt -> vllm") in kinds and ("retry", "tile-rt") in kinds
    assert again == first  # a counter that did not move makes no new event


def test_the_ring_keeps_only_the_last_requests_and_overflows_are_events() -> None:
    activity = Activity(Metrics(providers=["a", "b"], models=["m"]), size=3)
    recorder = Recorder(metrics=Metrics(providers=["a", "b"], models=["m"]), recent=activity.requests)
    for index in range(5):
        exchange = Exchange(request_id=f"r{index}", received_at=float(index), path="/chat/completions", stream=True)
        exchange.provider, exchange.reason, exchange.status = "b", "overflow:a" if index == 4 else "default", 200
        recorder.finish(exchange, now=index + 0.5)
    snapshot = activity.snapshot()
    assert [r["id"] for r in snapshot["requests"]] == ["r4", "r3", "r2"]
    assert [(e["kind"], e["detail"]) for e in snapshot["events"]] == [("overflow", "a -> b")]


AUTH = """
[[auth.keys]]
name = "ops"
key = "sk-ops"
admin = true

[[auth.keys]]
name = "team"
key = "sk-team"
"""


@pytest.mark.parametrize("path", ["/ui", "/ui/state"])
def test_with_auth_the_page_needs_an_admin_key_as_bearer_or_basic(path) -> None:
    with simulator_urls(["up"]) as urls, gateway(f'[providers.up]\napi_base = "{urls["up"]}/v1"\n{AUTH}') as stack:
        url = stack.url + path
        anonymous = httpx.get(url)
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Basic")
        assert anonymous.json()["error"]["code"] == "missing_api_key"
        assert httpx.get(url, headers={"Authorization": "Bearer sk-team"}).status_code == 403
        assert httpx.get(url, auth=("anyone", "sk-team")).status_code == 403
        assert httpx.get(url, auth=("anyone", "wrong")).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer sk-ops"}).status_code == 200
        assert httpx.get(url, auth=("ops", "sk-ops")).status_code == 200
