"""Metrics say what the response headers and the access log say: a fallback is counted
under the provider that answered, the tokens a client received before it left or the
stream broke are counted under the request's outcome, and every provider's series
exist before its first request (and after a reload that adds one)."""

from __future__ import annotations

import httpx
from completions import DONE, ROLE, content
from processes import poll
from replay import ReplayScript, replay_server
from stack import gateway, gateway_file, one_upstream_config

FAILING = ReplayScript.json_response(500, {"error": {"message": "engine died", "type": "server_error"}})
STREAM = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def metrics_of(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=10).text


def sample(text: str, series: str) -> float | None:
    """The value of the exact ``series`` (name and labels) in exposition ``text``."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_request_answered_by_a_fallback_is_counted_where_its_headers_say() -> None:
    answer = ReplayScript.sse(ROLE + content("ok") + DONE)
    with replay_server(FAILING) as primary, replay_server(answer) as fallback:
        text = (
            f'[defaults]\nmax_retries = 0\n\n[providers.vllm]\napi_base = "{primary.base_url}"\n\n'
            f'[providers.openai]\napi_base = "{fallback.base_url}"\n\n'
            '[routing]\ndefault_route = "vllm"\nfallbacks = { "vllm" = ["openai"] }\n'
        )
        with gateway(text) as gw:
            r = httpx.post(gw.v1 + "/chat/completions", json=STREAM, timeout=10)
            assert r.status_code == 200
            assert (r.headers["x-latgate-provider"], r.headers["x-latgate-route-reason"]) == ("openai", "fallback:vllm")
            metrics = metrics_of(gw.url)
    assert sample(metrics, 'latgate_route_decisions_total{provider="openai",reason="fallback:vllm"}') == 1.0
    assert 'latgate_route_decisions_total{provider="vllm"' not in metrics


def test_tokens_streamed_to_a_client_that_left_are_counted_under_client_gone() -> None:
    # 99 content chunks, then the upstream thinks for ever; the client reads the 99 and leaves
    body = ROLE + b"".join(content(f"t{i}") for i in range(99))
    with replay_server(ReplayScript.sse(body, end="stall")) as up, gateway(one_upstream_config(up.base_url)) as gw:
        with httpx.stream("POST", gw.v1 + "/chat/completions", json=STREAM, timeout=10) as r:
            seen = 0
            for line in r.iter_lines():
                seen += '"content": "t' in line
                if seen == 99:
                    break
        labels = 'model="other",outcome="client_gone",provider="up"'

        def counted() -> str | None:
            text = metrics_of(gw.url)
            return text if sample(text, 'latgate_requests_total{code="499",model="other",provider="up"}') else None

        metrics = poll(counted, timeout=10, what="the 499 to be recorded")
    assert sample(metrics, f"latgate_completion_tokens_total{{{labels}}}") == 99.0
    assert sample(metrics, f"latgate_e2e_request_latency_seconds_count{{{labels}}}") == 1.0
    assert sample(metrics, 'latgate_e2e_request_latency_seconds_count{model="other",outcome="ok",provider="up"}') == 0.0


def test_tokens_of_a_stream_broken_midway_are_counted_under_upstream_error() -> None:
    body = ROLE + b"".join(content(f"t{i}") for i in range(5))
    with replay_server(ReplayScript.sse(body, end="drop")) as up, gateway(one_upstream_config(up.base_url)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=STREAM, timeout=10)
        assert r.status_code == 200  # the head went with the first content; the end is an error event
        metrics = metrics_of(gw.url)
    labels = 'model="other",outcome="upstream_error",provider="up"'
    assert sample(metrics, 'latgate_requests_total{code="502",model="other",provider="up"}') == 1.0
    assert sample(metrics, f"latgate_completion_tokens_total{{{labels}}}") == 5.0
    assert sample(metrics, f"latgate_e2e_request_latency_seconds_count{{{labels}}}") == 1.0
    assert sample(metrics, f"latgate_prompt_tokens_total{{{labels}}}") > 0


PROVIDERS = """
[providers.fast]
api_base = "http://127.0.0.1:9/v1"
models = ["m"]

[providers.any]
api_base = "http://127.0.0.1:9/v1"

[routing]
default_route = "fast"
"""


def test_every_providers_series_exist_before_its_first_request_and_after_a_reload(tmp_path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(PROVIDERS)
    with gateway_file(path) as gw:
        metrics = metrics_of(gw.url)
        for provider, model in (("fast", "m"), ("any", "m"), ("any", "other")):
            pm = f'model="{model}",provider="{provider}"'
            pmo = f'model="{model}",outcome="ok",provider="{provider}"'
            for series in (
                f'latgate_in_flight_requests{{provider="{provider}"}}',
                f'latgate_requests_total{{code="200",{pm}}}',
                f"latgate_time_to_first_token_seconds_count{{{pm}}}",
                f"latgate_inter_token_latency_seconds_count{{{pm}}}",
                f"latgate_e2e_request_latency_seconds_count{{{pmo}}}",
                f"latgate_output_tokens_per_second_count{{{pmo}}}",
                f"latgate_prompt_tokens_total{{{pmo}}}",
                f"latgate_completion_tokens_total{{{pmo}}}",
            ):
                assert sample(metrics, series) == 0.0, series
        assert 'model="other",provider="fast"' not in metrics  # it lists m only
        path.write_text(PROVIDERS + '\n[providers.added]\napi_base = "http://127.0.0.1:9/v1"\nmodels = ["m"]\n')
        assert httpx.post(gw.url + "/admin/reload").status_code == 200
        metrics = metrics_of(gw.url)
    assert sample(metrics, 'latgate_in_flight_requests{provider="added"}') == 0.0
    assert sample(metrics, 'latgate_completion_tokens_total{model="m",outcome="ok",provider="added"}') == 0.0
