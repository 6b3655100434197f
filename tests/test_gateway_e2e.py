"""End to end: real clients -> latgate under uvicorn -> simulators on loopback."""

from __future__ import annotations

import logging
import re

import httpx
import openai
import pytest
from stack import FAST, demo_stack, leave_after_first_content

from latgate.commands.sim import SimOptions

MESSAGES = [{"role": "user", "content": "write a haiku about latency"}]


def test_openai_sdk_streams_a_latency_sensitive_request_from_the_decode_pool() -> None:
    with demo_stack() as stack:
        client = openai.OpenAI(base_url=stack.v1, api_key="client-key", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="glm-5.1", messages=MESSAGES, stream=True, extra_headers={"X-Latency-Sensitive": "1"}
        )
        assert raw.headers["x-latgate-provider"] == "tile-rt"
        assert raw.headers["x-latgate-route-reason"] == "latency_sensitive"
        assert int(raw.headers["x-latgate-prompt-tokens"]) > 0
        assert raw.headers["x-request-id"]
        chunks = list(raw.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.strip()
        # the client did not ask for usage: latgate asked upstream for it and kept it back
        assert all(c.usage is None for c in chunks)
        sent = stack.sims["tile-rt"].stats.last_request.body
        assert sent["stream_options"] == {"include_usage": True}
        assert stack.sims["vllm"].stats.requests_total == 0


def test_stream_usage_reaches_a_client_that_asked_for_it() -> None:
    with demo_stack() as stack:
        client = openai.OpenAI(base_url=stack.v1, api_key="k", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="glm-5.1", messages=MESSAGES, stream=True, stream_options={"include_usage": True}, max_tokens=12
            )
        )
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 12
        assert chunks[-1].choices == []


def test_ordinary_request_goes_to_the_default_pool_and_returns_usage() -> None:
    with demo_stack() as stack:
        client = openai.OpenAI(base_url=stack.url, api_key="k", max_retries=0)  # base URL without /v1
        raw = client.chat.completions.with_raw_response.create(model="glm-5.1", messages=MESSAGES, max_tokens=5)
        completion = raw.parse()
        assert raw.headers["x-latgate-provider"] == "vllm"
        assert raw.headers["x-latgate-route-reason"] == "default"
        assert completion.usage.completion_tokens == 5
        assert completion.usage.prompt_tokens > 0
        assert completion.choices[0].message.content


def test_alias_marked_latency_sensitive_is_served_by_the_decode_pool_under_its_public_name() -> None:
    with demo_stack() as stack:
        client = openai.OpenAI(base_url=stack.v1, api_key="k", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model="glm-5.1-highspeed", messages=MESSAGES)
        completion = raw.parse()
        assert raw.headers["x-latgate-provider"] == "tile-rt"
        assert completion.model == "glm-5.1-highspeed"
        assert stack.sims["tile-rt"].stats.last_request.body["model"] == "glm-5.1"
        chunks = list(client.chat.completions.create(model="glm-5.1-highspeed", messages=MESSAGES, stream=True))
        assert {c.model for c in chunks} == {"glm-5.1-highspeed"}


def test_budget_header_above_the_threshold_stays_on_the_default_pool() -> None:
    with demo_stack() as stack:
        r = httpx.post(
            stack.v1 + "/chat/completions",
            json={"model": "glm-5.1", "messages": MESSAGES},
            headers={"X-Latency-Budget-Ms": "500"},
        )
        assert r.status_code == 200 and r.headers["x-latgate-provider"] == "vllm"
        r = httpx.post(
            stack.v1 + "/chat/completions",
            json={"model": "glm-5.1", "messages": MESSAGES},
            headers={"X-Latency-Budget-Ms": "150"},
        )
        assert r.status_code == 200 and r.headers["x-latgate-provider"] == "tile-rt"


def test_failing_decode_pool_falls_back_before_the_first_byte() -> None:
    with demo_stack(tile=SimOptions(name="tile-rt", error_rate=1.0, seed=1, **FAST), max_retries=1) as stack:
        r = httpx.post(
            stack.v1 + "/chat/completions",
            json={"model": "glm-5.1", "messages": MESSAGES, "stream": True},
            headers={"X-Latency-Sensitive": "true"},
        )
        assert r.status_code == 200
        assert r.headers["x-latgate-provider"] == "vllm"
        assert r.headers["x-latgate-route-reason"] == "fallback:tile-rt"
        assert r.text.rstrip().endswith("data: [DONE]")
        assert stack.sims["tile-rt"].stats.requests_total == 2  # one try + one retry
        metrics = httpx.get(stack.url + "/metrics").text
        assert 'latgate_fallbacks_total{from="tile-rt",to="vllm"} 1.0' in metrics
        assert 'latgate_retries_total{provider="tile-rt"} 1.0' in metrics


def test_model_served_only_by_the_upstream_goes_there_with_its_key_and_never_the_clients(caplog) -> None:
    secret = "sk-upstream-secret-4242"
    caplog.set_level(logging.DEBUG)
    with demo_stack(env={"TAOTOKEN_API_KEY": secret}) as stack:
        r = httpx.post(
            stack.v1 + "/chat/completions",
            json={"model": "qwen2.5-72b-instruct", "messages": MESSAGES, "stream": True},
            headers={"Authorization": "Bearer client-key", "Cookie": "session=abc"},
        )
        assert r.status_code == 200
        assert r.headers["x-latgate-provider"] == "taotoken"
        assert r.headers["x-latgate-route-reason"] == "model"
        received = stack.sims["taotoken"].stats.last_request.headers
        assert received["authorization"] == f"Bearer {secret}"
        assert "cookie" not in received
        surfaces = [r.text, str(r.headers), httpx.get(stack.url + "/metrics").text, httpx.get(stack.url + "/admin/providers").text, caplog.text]
        for surface in surfaces:
            assert secret not in surface
            assert "client-key" not in surface
        assert '"request_id"' in caplog.text  # the access log line was written


def test_client_disconnect_closes_the_upstream_request() -> None:
    slow = SimOptions(name="vllm", tpot_ms=20, default_max_tokens=500, max_output_tokens=500)
    with demo_stack(vllm=slow) as stack:
        body = {"model": "glm-5.1", "messages": MESSAGES, "stream": True}
        leave_after_first_content(stack.v1 + "/chat/completions", body)
        assert stack.sims["vllm"].stats.disconnected_event.wait(5)
        metrics = httpx.get(stack.url + "/metrics").text
        assert 'latgate_in_flight_requests{provider="vllm"} 0.0' in metrics
        assert 'code="499"' in metrics


def test_metrics_have_the_design_names_and_labels_after_traffic() -> None:
    with demo_stack() as stack:
        client = openai.OpenAI(base_url=stack.v1, api_key="k", max_retries=0)
        list(client.chat.completions.create(model="glm-5.1", messages=MESSAGES, stream=True, max_tokens=8))
        text = httpx.get(stack.url + "/metrics").text
        for needle in [
            'latgate_requests_total{code="200",model="glm-5.1",provider="vllm"} 1.0',
            'latgate_route_decisions_total{provider="vllm",reason="default"} 1.0',
            'latgate_time_to_first_token_seconds_count{model="glm-5.1",provider="vllm"} 1.0',
            'latgate_e2e_request_latency_seconds_count{model="glm-5.1",outcome="ok",provider="vllm"} 1.0',
            'latgate_output_tokens_per_second_count{model="glm-5.1",outcome="ok",provider="vllm"} 1.0',
            'latgate_completion_tokens_total{model="glm-5.1",outcome="ok",provider="vllm"} 8.0',
            'latgate_prompt_tokens_total{model="glm-5.1",outcome="ok",provider="vllm"}',
            'latgate_in_flight_requests{provider="vllm"} 0.0',
            'latgate_provider_healthy{endpoint="tile-rt-0",provider="tile-rt"} 1.0',
            "latgate_gateway_overhead_seconds_count 1.0",
        ]:
            assert needle in text, needle
        # one gap per write that carried new tokens: at most 7 for 8 tokens (reads may coalesce)
        itl = re.search(r'latgate_inter_token_latency_seconds_count\{model="glm-5.1",provider="vllm"\} (\S+)', text)
        assert itl and 1 <= float(itl.group(1)) <= 7


def test_metrics_page_carries_no_created_series() -> None:
    with demo_stack() as stack:
        client = openai.OpenAI(base_url=stack.v1, api_key="k", max_retries=0)
        client.chat.completions.create(model="glm-5.1", messages=MESSAGES, max_tokens=2)
        text = httpx.get(stack.url + "/metrics").text
    assert 'latgate_requests_total{code="200",model="glm-5.1",provider="vllm"} 1.0' in text
    assert "_created" not in text


def test_models_list_is_the_union_of_served_models_and_aliases_in_openai_shape() -> None:
    with demo_stack() as stack:
        for base in (stack.v1, stack.url):
            body = httpx.get(base + "/models").json()
            assert body["object"] == "list"
            ids = [m["id"] for m in body["data"]]
            assert {"glm-5.1", "qwen2.5-72b-instruct", "glm-5.1-highspeed"} <= set(ids)
            assert all(m["object"] == "model" and "owned_by" in m for m in body["data"])
        assert httpx.get(stack.v1 + "/models/glm-5.1-highspeed").json()["id"] == "glm-5.1-highspeed"
        # The demo config has a catch-all alias: any name is served, by chat and lookup alike.
        assert httpx.get(stack.v1 + "/models/nope").json()["id"] == "nope"


@pytest.mark.parametrize(
    ("content", "body", "status", "param"),
    [
        ("{not json", None, 400, None),
        (None, {"model": "glm-5.1"}, 400, "messages"),
        (None, {"model": "glm-5.1", "messages": "hi"}, 400, "messages"),
        (None, {"model": "glm-5.1", "messages": MESSAGES, "stream": "yes"}, 400, "stream"),
        (b"\xff\xfe{}", None, 400, None),
        ("[1, 2]", None, 400, None),
    ],
)
def test_bad_requests_get_an_openai_error_envelope(content, body, status, param) -> None:
    with demo_stack() as stack:
        r = httpx.post(stack.v1 + "/chat/completions", content=content, json=body, headers={"content-type": "application/json"})
        assert r.status_code == status
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param
        assert "Traceback" not in r.text


def test_unknown_route_and_method_get_envelopes_and_base_url_probes_answer() -> None:
    with demo_stack() as stack:
        r = httpx.get(stack.v1 + "/nope")
        assert r.status_code == 404 and "error" in r.json()
        r = httpx.get(stack.v1 + "/chat/completions")
        assert r.status_code == 405 and "error" in r.json()
        assert httpx.head(stack.url + "/").status_code == 200
        assert httpx.get(stack.url + "/").status_code == 200
        assert httpx.get(stack.url + "/healthz").status_code == 200
        assert httpx.get(stack.url + "/readyz").status_code == 200


def test_oversized_body_gets_413_naming_the_limit() -> None:
    with demo_stack() as stack:
        limit = stack.config.server.max_body_bytes
        r = httpx.post(stack.v1 + "/chat/completions", content=b"x" * (limit + 1), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert str(limit) in r.json()["error"]["message"]


def test_completions_and_embeddings_are_proxied() -> None:
    with demo_stack() as stack:
        client = openai.OpenAI(base_url=stack.v1, api_key="k", max_retries=0)
        completion = client.completions.create(model="glm-5.1", prompt="def add(a, b):", max_tokens=4)
        assert completion.choices[0].text
        chunks = list(client.completions.create(model="glm-5.1", prompt="hello", max_tokens=4, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices)
        emb = client.embeddings.create(model="glm-5.1", input=["a", "b"])
        assert len(emb.data) == 2 and emb.data[0].embedding


def test_log_lines_carry_no_internal_upstream_address(caplog) -> None:
    from latgate.process.server import setup_logging

    setup_logging("info")
    caplog.set_level(logging.INFO)
    with demo_stack() as stack:
        r = httpx.post(stack.v1 + "/chat/completions", json={"model": "glm-5.1", "messages": MESSAGES, "stream": True})
        assert r.status_code == 200
        ports = {str(app_url.rsplit(":", 1)[1]) for app_url in [stack.config.providers[p].endpoints[0].api_base.removesuffix("/v1") for p in stack.config.providers]}
    assert '"provider":"vllm"' in caplog.text
    for port in ports:
        assert f"127.0.0.1:{port}" not in caplog.text


def test_non_streamed_requests_are_measured_and_logged(caplog) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    with demo_stack() as stack:
        client = openai.OpenAI(base_url=stack.v1, api_key="k", max_retries=0)
        client.chat.completions.create(model="glm-5.1", messages=MESSAGES, max_tokens=6)
        client.completions.create(model="glm-5.1", prompt="x", max_tokens=3)
        text = httpx.get(stack.url + "/metrics").text
    assert 'latgate_requests_total{code="200",model="glm-5.1",provider="vllm"} 2.0' in text
    assert 'latgate_completion_tokens_total{model="glm-5.1",outcome="ok",provider="vllm"} 9.0' in text
    assert 'latgate_e2e_request_latency_seconds_count{model="glm-5.1",outcome="ok",provider="vllm"} 2.0' in text
    lines = [r.getMessage() for r in caplog.records if r.name == "latgate.access"]
    assert len(lines) == 2 and all('"stream":false' in line and '"status":200' in line for line in lines)
