"""The simulator's ``tilert`` profile: TileRT's prefill/decode router interface on loopback."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from servers import serve_app

from latgate.commands.sim import SimOptions, create_sim_app

TILERT = SimOptions(profile="tilert", models=("glm-5.1",), decode_nodes=2, ttft_overhead_ms=1.0, tpot_ms=0.5, default_max_tokens=6)
ASK = {"model": "glm-5.1", "messages": [{"role": "user", "content": "hi"}]}


def events(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_health_and_pool_status_report_free_decode_nodes_and_nothing_else_is_served() -> None:
    with serve_app(create_sim_app(TILERT)) as url:
        assert httpx.get(url + "/health").json() == {"status": "ok", "decode_free": 2}
        nodes = httpx.get(url + "/pool_status").json()["nodes"]
        assert [node["busy"] for node in nodes] == [False, False] and all(node["host"] for node in nodes)
        for path in ("/v1/models", "/metrics", "/models", "/chat/completions"):
            assert httpx.get(url + path).status_code == 404


def test_stream_is_role_chunk_content_finish_with_usage_then_done_whatever_stream_options_say() -> None:
    with serve_app(create_sim_app(TILERT)) as url:
        body = {**ASK, "stream": True, "stream_options": {"include_usage": False}}
        r = httpx.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert '"content": "' in r.text  # Python's default JSON separators, as TileRT's json.dumps writes them
    chunks = events(r.text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1] == "[DONE]"
    finish = chunks[-2]
    assert finish["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert finish["usage"] == {"prompt_tokens": finish["usage"]["prompt_tokens"], "completion_tokens": 6}
    content = [c["choices"][0]["delta"]["content"] for c in chunks[1:-2]]
    assert len(content) == 6 and all(content)


def test_every_node_busy_is_an_immediate_429_with_a_string_error() -> None:
    slow = SimOptions(profile="tilert", decode_nodes=1, tpot_ms=50.0, default_max_tokens=400, max_output_tokens=400)
    app = create_sim_app(slow)
    with serve_app(app) as url, httpx.Client(timeout=10) as client:
        with client.stream("POST", url + "/v1/chat/completions", json={**ASK, "stream": True}) as held:
            lines = held.iter_lines()  # kept: a dropped iterator closes the response
            next(lines)
            assert client.get(url + "/health").json()["decode_free"] == 0
            busy = client.post(url + "/v1/chat/completions", json=ASK)
            assert busy.status_code == 429 and busy.json() == {"error": "all decode nodes busy"}
            assert client.get(url + "/pool_status").json()["nodes"][0]["busy"] is True
        # the client left: its node is free again
        assert app.stats.disconnected_event.wait(10)
        assert client.get(url + "/health").json()["decode_free"] == 1
    assert app.stats.busy_rejections == 1


def test_non_streamed_answers_carry_pd_timing_and_usage_without_total_tokens() -> None:
    with serve_app(create_sim_app(TILERT)) as url:
        chat = httpx.post(url + "/v1/chat/completions", json=ASK).json()
        text = httpx.post(url + "/v1/completions", json={"model": "glm-5.1", "prompt": "hi"}).json()
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
    assert set(chat["usage"]) == {"prompt_tokens", "completion_tokens"}
    assert {"prefill", "decode"} <= set(chat["pd_timing_ms"])
    assert text["object"] == "text_completion" and len(text["choices"][0]["token_ids"]) == 6
    assert "pd_timing_ms" in text


def test_streamed_completions_are_refused_with_a_400_string_error() -> None:
    with serve_app(create_sim_app(TILERT)) as url:
        r = httpx.post(url + "/v1/completions", json={"model": "glm-5.1", "prompt": "hi", "stream": True})
    assert r.status_code == 400 and r.json() == {"error": "streaming is supported on /v1/chat/completions"}


@pytest.mark.parametrize("after", [0, 3])
def test_decode_error_is_written_into_the_text_then_a_normal_finish_and_done(after: int) -> None:
    options = SimOptions(profile="tilert", decode_error_rate=1.0, decode_error_after_tokens=after, tpot_ms=0.0, default_max_tokens=6)
    with serve_app(create_sim_app(options)) as url:
        chunks = events(httpx.post(url + "/v1/chat/completions", json={**ASK, "stream": True}).text)
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert len(contents) == after + 1 and contents[-1].startswith("\n[decode error: ")
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-2]["usage"]["completion_tokens"] == after
    assert chunks[-1] == "[DONE]"


def test_an_exception_mid_stream_ends_the_stream_without_finish_or_done() -> None:
    options = SimOptions(profile="tilert", drop_rate=1.0, seed=3, tpot_ms=0.0, default_max_tokens=6)
    app = create_sim_app(options)
    with serve_app(app) as url:
        r = httpx.post(url + "/v1/chat/completions", json={**ASK, "stream": True})  # a clean end, no broken connection
    chunks = events(r.text)
    assert r.status_code == 200 and chunks and "[DONE]" not in chunks
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert app.stats.drops == 1


def test_prefill_failure_is_a_502_string_error() -> None:
    with serve_app(create_sim_app(SimOptions(profile="tilert", error_rate=1.0, seed=1))) as url:
        r = httpx.post(url + "/v1/chat/completions", json={**ASK, "stream": True})
    assert r.status_code == 502 and isinstance(r.json()["error"], str)
