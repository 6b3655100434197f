"""latgate bench: measurement rules, statistics, and runs against a real loopback server.

The server is a tiny Starlette app that streams a known SSE sequence. It reads the
request number from the tag the bench puts in each prompt, so which requests fail
and which provider "answers" is fixed by request number, whatever the concurrency.
Timing rules are tested by feeding ``SampleRecorder`` explicit timestamps; runs
against the server assert on counts, never on durations.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, replace

import orjson
import pytest
from completions import DONE, ROLE, chat_chunk, content, event
from servers import serve_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from latgate.commands.bench.plot import panel_values, served_by, write_plot
from latgate.commands.bench.runner import BenchConfig, normalize_base_url, run_bench
from latgate.commands.bench.sample import RequestSample, SampleRecorder
from latgate.commands.bench.sse import SseDecoder
from latgate.commands.bench.stats import percentile, summarize, summarize_samples
from latgate.commands.bench.workload import Workload, WorkloadSpec
from latgate.commands.cli import main as latgate_main
from latgate.routing.tokens import estimate_text_tokens

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_TAG = re.compile(r"\[bench \w+ request (\d+)\]")


@dataclass(frozen=True)
class FakeEngine:
    """How the test server answers request number ``i`` (from the prompt's tag)."""

    content_chunks: int = 5
    send_usage: bool = True
    status_for: dict[int, int] | None = None  # i % len -> status, e.g. {0: 500, 1: 429}
    provider_for_even: str | None = None
    provider_for_odd: str | None = None
    error_event_after: int | None = None  # send {"error": ...} after this many chunks
    drop_after: int | None = None  # raise mid-stream (connection dropped) after this many chunks
    omit_done: bool = False


def create_fake_engine_app(engine: FakeEngine) -> Starlette:
    async def chat_completions(request: Request) -> Response:
        body = await request.json()
        index = int(_TAG.search(body["messages"][0]["content"]).group(1))
        headers = {}
        provider = engine.provider_for_even if index % 2 == 0 else engine.provider_for_odd
        if provider is not None:
            headers = {"X-Latgate-Provider": provider, "X-Latgate-Route-Reason": f"reason-{provider}"}
        status = engine.status_for[index % len(engine.status_for)] if engine.status_for else 200
        if status != 200:
            envelope = {
                "error": {
                    "message": f"simulated {status}",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            }
            return JSONResponse(envelope, status_code=status, headers=headers)
        usage = {
            "prompt_tokens": 11,
            "completion_tokens": engine.content_chunks,
            "total_tokens": 11 + engine.content_chunks,
        }
        if not body.get("stream"):
            reply = {
                "id": "c1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "message": {"role": "assistant", "content": "tok " * engine.content_chunks},
                    }
                ],
                "usage": usage,
            }
            return JSONResponse(reply, headers=headers)

        async def events():
            yield ROLE
            for i in range(engine.content_chunks):
                if i == engine.error_event_after:
                    yield b'data: {"error": {"message": "upstream died", "type": "server_error"}}\n\n'
                if i == engine.drop_after:
                    raise RuntimeError("simulated connection drop")
                yield content(f"tok{i} ")
            yield event(chat_chunk({}, finish_reason="length"))
            if engine.send_usage and body.get("stream_options", {}).get("include_usage"):
                yield event(chat_chunk(usage=usage))
            if not engine.omit_done:
                yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    return Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"])])


def bench_config(base_url: str, **changes) -> BenchConfig:
    config = BenchConfig(
        base_url=normalize_base_url(base_url),
        model="m",
        requests=6,
        concurrency=3,
        stream=True,
        prompt_tokens=50,
        max_tokens=16,
        headers=(),
        api_key=None,
        timeout_seconds=10.0,
        shared_prefix=False,
        run_id="test",
    )
    return replace(config, **changes)


def run_against(engine: FakeEngine, **changes):
    with serve_app(create_fake_engine_app(engine)) as base_url:
        return asyncio.run(run_bench(bench_config(base_url, **changes)))


# --- measurement rules, with explicit timestamps ---------------------------------------


def test_ttft_counts_from_first_content_chunk_not_role_chunk():
    recorder = SampleRecorder(index=0, started_at=10.0)
    recorder.on_response(status_code=200, headers={})
    recorder.on_event(b'{"choices": [{"delta": {"role": "assistant", "content": ""}}]}', at=10.1)
    recorder.on_event(b'{"choices": [{"delta": {"content": "a"}}]}', at=10.3)
    recorder.on_event(b'{"choices": [{"delta": {"content": "b"}}]}', at=10.35)
    recorder.on_event(b'{"choices": [{"delta": {"content": "c"}}]}', at=10.5)
    recorder.on_event(b'{"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 7}}', at=10.6)
    recorder.on_event(b"[DONE]", at=10.7)
    sample = recorder.finish(at=11.0)
    assert sample.ok
    assert sample.ttft_ms == pytest.approx(300.0)
    assert sample.e2e_ms == pytest.approx(700.0)  # ends at [DONE], not when the socket closed
    assert sample.itl_ms == pytest.approx([50.0, 150.0])
    assert sample.completion_tokens == 3 and sample.prompt_tokens == 7 and sample.usage_reported
    assert sample.tokens_per_second == pytest.approx(3 / 0.2)
    assert sample.e2e_tokens_per_second == pytest.approx(3 / 0.7)


def test_reasoning_and_tool_call_deltas_count_as_output():
    recorder = SampleRecorder(index=0, started_at=0.0)
    recorder.on_response(status_code=200, headers={})
    recorder.on_event(b'{"choices": [{"delta": {"reasoning_content": "hmm"}}]}', at=0.2)
    recorder.on_event(
        b'{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}]}', at=0.4
    )
    recorder.on_event(b'{"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}', at=0.5)
    recorder.on_event(b"[DONE]", at=0.5)
    sample = recorder.finish(at=0.5)
    assert sample.ttft_ms == pytest.approx(200.0)
    assert sample.output_chunks == 2 and sample.completion_tokens == 2 and not sample.usage_reported
    assert sample.finish_reason == "tool_calls"


def test_stream_without_done_or_finish_reason_is_incomplete():
    recorder = SampleRecorder(index=0, started_at=0.0)
    recorder.on_response(status_code=200, headers={})
    recorder.on_event(b'{"choices": [{"delta": {"content": "a"}}]}', at=0.1)
    sample = recorder.finish(at=0.2)
    assert not sample.ok and sample.error_kind == "incomplete_stream"
    assert sample.tokens_per_second is None


def test_sse_decoder_joins_multiline_data_and_skips_comments():
    decoder = SseDecoder()
    reads = [
        b": keep-alive\r\n\r\nevent: message\r\ndata:first\r",
        b"\ndata: sec",
        b"ond\n\n",
        b"data: [DONE]",
    ]
    events = [data for read in reads for data in decoder.feed(read)]
    assert events == [b"first\nsecond"]
    assert decoder.flush() == [b"[DONE]"]


def test_sse_decoder_splits_events_at_any_read_boundary():
    stream = b"".join(content(f"t{i}") for i in range(3)) + DONE
    for size in (1, 2, 7, len(stream)):
        decoder = SseDecoder()
        events = [
            data
            for start in range(0, len(stream), size)
            for data in decoder.feed(stream[start : start + size])
        ]
        assert len(events) == 4 and events[-1] == b"[DONE]" and decoder.flush() == []


# --- statistics ------------------------------------------------------------------------


def test_percentiles_interpolate_between_ranks():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 90) == pytest.approx(90.1)
    assert percentile(values, 99) == pytest.approx(99.01)
    metric = summarize([3.0, 1.0, 2.0])
    assert (metric.min, metric.p50, metric.max, metric.mean, metric.count) == (1.0, 2.0, 3.0, 2.0, 3)
    assert summarize([]) is None


# --- base URL and workload -------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "normalized"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1"),
        ("https://taotoken.net/api", "https://taotoken.net/api/v1"),
        ("http://127.0.0.1:8000/v1/chat/completions", "http://127.0.0.1:8000/v1"),
    ],
)
def test_base_url_gets_v1_unless_it_ends_with_it(given, normalized):
    assert normalize_base_url(given) == normalized


def test_prompt_is_about_the_requested_size_and_differs_from_its_start():
    workload = Workload(
        WorkloadSpec(model="m", prompt_tokens=2000, max_tokens=8, stream=True, shared_prefix=False, run_id="r1")
    )
    contents = [orjson.loads(workload.body(i))["messages"][0]["content"] for i in range(2)]
    assert abs(estimate_text_tokens(contents[0]) - 2000) <= 20
    assert contents[0][:20] != contents[1][:20]
    shared = Workload(
        WorkloadSpec(model="m", prompt_tokens=2000, max_tokens=8, stream=True, shared_prefix=True, run_id="r1")
    )
    shared_contents = [orjson.loads(shared.body(i))["messages"][0]["content"] for i in range(2)]
    assert shared_contents[0][:-30] == shared_contents[1][:-30] and shared_contents[0] != shared_contents[1]
    body = orjson.loads(workload.body(0))
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 8


# --- runs against a loopback server ----------------------------------------------------


def test_streamed_run_counts_tokens_from_usage():
    result = run_against(FakeEngine(content_chunks=5), requests=6, concurrency=3)
    assert [s.index for s in result.samples] == list(range(6))
    assert all(s.ok for s in result.samples)
    assert {s.completion_tokens for s in result.samples} == {5}
    assert all(s.usage_reported and s.output_chunks == 5 and len(s.itl_ms) == 4 for s in result.samples)
    assert all(s.ttft_ms is not None and s.ttft_ms <= s.e2e_ms for s in result.samples)
    summary = summarize_samples(result.samples, duration_seconds=result.duration_seconds)
    assert summary.completion_tokens == 30 and summary.metrics["itl_ms"].count == 24


def test_tokens_are_counted_from_chunks_when_usage_is_absent():
    result = run_against(FakeEngine(content_chunks=4, send_usage=False), requests=2, concurrency=1)
    assert [(s.completion_tokens, s.usage_reported) for s in result.samples] == [(4, False), (4, False)]


def test_server_errors_are_counted_by_kind():
    engine = FakeEngine(status_for={0: 500, 1: 429, 2: 200, 3: 200})
    result = run_against(engine, requests=8, concurrency=4)
    summary = summarize_samples(result.samples, duration_seconds=result.duration_seconds)
    assert summary.errors == {"http_500": 2, "http_429": 2}
    assert (summary.succeeded, summary.failed) == (4, 4)
    assert result.samples[0].error_message == "simulated 500"
    assert summary.metrics["ttft_ms"].count == 4  # failed requests feed no latency metric


def test_mid_stream_failures_are_counted_by_kind():
    errors = run_against(FakeEngine(error_event_after=2), requests=2, concurrency=2)
    assert {s.error_kind for s in errors.samples} == {"stream_error"}
    dropped = run_against(FakeEngine(drop_after=2), requests=2, concurrency=2)
    assert {s.error_kind for s in dropped.samples} == {"read_error"}
    truncated = run_against(FakeEngine(omit_done=True), requests=1, concurrency=1)
    assert truncated.samples[0].ok  # a finish_reason without [DONE] still completes the reply


def test_provider_headers_are_aggregated():
    engine = FakeEngine(
        provider_for_even="tile-rt", provider_for_odd="vllm", status_for={0: 200, 1: 200, 2: 503}
    )
    result = run_against(engine, requests=6, concurrency=2)
    summary = summarize_samples(result.samples, duration_seconds=result.duration_seconds)
    assert {name: p.requests for name, p in summary.providers.items()} == {"tile-rt": 3, "vllm": 3}
    assert {name: p.errors for name, p in summary.providers.items()} == {"tile-rt": 1, "vllm": 1}
    assert summary.route_reasons == {"reason-tile-rt": 3, "reason-vllm": 3}


def test_no_stream_measures_e2e_only():
    result = run_against(FakeEngine(content_chunks=7), requests=3, concurrency=3, stream=False)
    assert all(s.ok and s.ttft_ms == s.e2e_ms for s in result.samples)
    assert {s.completion_tokens for s in result.samples} == {7}
    assert all(s.tokens_per_second is None and s.e2e_tokens_per_second for s in result.samples)


def test_extra_headers_and_api_key_are_sent():
    seen: list[dict[str, str]] = []

    async def chat_completions(request: Request) -> Response:
        seen.append(dict(request.headers))
        return JSONResponse({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})

    app = Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"])])
    with serve_app(app) as base_url:
        config = bench_config(
            f"{base_url}/v1/",
            requests=1,
            concurrency=1,
            stream=False,
            api_key="sk-test",
            headers=(("X-Latency-Sensitive", "1"),),
        )
        result = asyncio.run(run_bench(config))
    assert result.samples[0].ok
    assert seen[0]["authorization"] == "Bearer sk-test" and seen[0]["x-latency-sensitive"] == "1"


# --- the command line ------------------------------------------------------------------


def test_cli_writes_json_summary_and_png(tmp_path, capsys):
    engine = FakeEngine(
        provider_for_even="tile-rt", provider_for_odd="vllm", status_for={0: 200, 1: 200, 2: 200, 3: 429}
    )
    json_path, png_path = tmp_path / "out.json", tmp_path / "out.png"
    with serve_app(create_fake_engine_app(engine)) as base_url:
        status = latgate_main(
            [
                "bench",
                "--base-url",
                base_url,
                "--model",
                "m",
                "-n",
                "8",
                "-c",
                "4",
                "--max-tokens",
                "5",
                "--json",
                str(json_path),
                "--plot",
                str(png_path),
            ]
        )
    assert status == 0
    document = json.loads(json_path.read_text())
    assert document["schema"] == "latgate.commands.bench/1"
    assert set(document) == {
        "schema",
        "config",
        "totals",
        "summary",
        "errors",
        "providers",
        "route_reasons",
        "samples",
    }
    assert document["config"]["url"] == f"{base_url}/v1/chat/completions"
    assert set(document["summary"]["ttft_ms"]) == {"count", "mean", "min", "p50", "p90", "p99", "max"}
    assert document["errors"] == {"http_429": 2}
    assert document["providers"]["tile-rt"]["requests"] == 4
    assert len(document["samples"]) == 8 and document["samples"][3]["error_kind"] == "http_429"
    assert png_path.read_bytes()[:8] == PNG_MAGIC
    out = capsys.readouterr().out
    assert "TTFT (ms)" in out and "tile-rt x4" in out


def test_connection_refused_for_every_request_exits_1(capsys):
    with socket.socket() as bound_not_listening:  # the kernel refuses connections to it
        bound_not_listening.bind(("127.0.0.1", 0))
        port = bound_not_listening.getsockname()[1]
        status = latgate_main(["bench", "--base-url", f"http://127.0.0.1:{port}", "--model", "m", "-n", "3"])
    captured = capsys.readouterr()
    assert status == 1
    assert "connect_error x3" in captured.out
    assert captured.err.strip().splitlines()[-1] == (
        f"latgate: error: all 3 requests failed; first: connect_error: cannot connect to 127.0.0.1:{port}: "
        "Connection refused"
    )
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-H", "no colon here"], "-H expects 'Name: value'"),
        (["-n", "0"], "-n/--requests must be at least 1"),
        (["--timeout", "0"], "--timeout must be a positive"),
    ],
)
def test_bad_input_is_one_line_error(extra, message, capsys):
    status = latgate_main(["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", *extra])
    err = capsys.readouterr().err
    assert status == 2
    assert err.splitlines() == [f"latgate: error: {err.split('error: ', 1)[1].strip()}"]
    assert message in err


def test_bad_base_url_is_one_line_error(capsys):
    assert latgate_main(["bench", "--base-url", "localhost:8000", "--model", "m"]) == 2
    assert capsys.readouterr().err.startswith("latgate: error: --base-url must look like")


def test_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec reports it missing
    status = latgate_main(
        ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--plot", str(tmp_path / "p.png")]
    )
    assert status == 2
    assert "pip install 'latgate[plot]'" in capsys.readouterr().err


def test_bench_runs_as_a_subprocess(tmp_path):
    json_path = tmp_path / "out.json"
    with serve_app(create_fake_engine_app(FakeEngine(content_chunks=3))) as base_url:
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "latgate",
                "bench",
                "--base-url",
                f"{base_url}/v1",
                "--model",
                "m",
                "-n",
                "1",
                "-H",
                "X-Latency-Sensitive: 1",
                "--json",
                str(json_path),
            ],
            check=False,  # the exit code is asserted below, with stderr in the message
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    assert completed.returncode == 0, completed.stderr
    assert "TTFT (ms)" in completed.stdout
    assert re.search(r"^TTFT [\d.]+ ms, total [\d.]+ ms, 3 completion tokens", completed.stdout, re.MULTILINE)
    assert "bench: 1/1 requests done, 0 errors" in completed.stderr  # plain progress off a terminal
    assert json.loads(json_path.read_text())["totals"]["completion_tokens"] == 3


def test_bench_against_the_engine_simulator():
    sim_app = pytest.importorskip("latgate.commands.sim.app", reason="the simulator has not landed")
    sim_options = pytest.importorskip("latgate.commands.sim.options")
    with serve_app(sim_app.create_sim_app(sim_options.SimOptions(tpot_ms=0.5, seed=1))) as base_url:
        result = asyncio.run(
            run_bench(bench_config(base_url, requests=4, concurrency=2, max_tokens=12, prompt_tokens=200))
        )
    assert all(s.ok and s.usage_reported for s in result.samples), [s.error_message for s in result.samples]
    assert {(s.completion_tokens, s.output_chunks, len(s.itl_ms)) for s in result.samples} == {(12, 12, 11)}
    assert all(s.prompt_tokens >= 150 for s in result.samples)
    with serve_app(sim_app.create_sim_app(sim_options.SimOptions(rate_limit_rate=1.0, seed=1))) as base_url:
        limited = asyncio.run(run_bench(bench_config(base_url, requests=3, concurrency=3)))
    assert summarize_samples(limited.samples, duration_seconds=1.0).errors == {"http_429": 3}


def test_server_that_never_answers_is_a_timeout():
    with socket.socket() as silent:  # listens (the kernel completes handshakes) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        base_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        result = asyncio.run(
            run_bench(bench_config(base_url, requests=2, concurrency=2, timeout_seconds=0.2))
        )
    assert [s.error_kind for s in result.samples] == ["timeout", "timeout"]


def _sample(index: int, *, provider: str | None, ok: bool = True, ttft: float | None = 5.0) -> RequestSample:
    return RequestSample(
        index=index, ok=ok, status_code=200 if ok else 503, error_kind=None if ok else "http_503",
        error_message=None, provider=provider, route_reason="default", ttft_ms=ttft, e2e_ms=40.0 + index,
        completion_tokens=8, prompt_tokens=3, usage_reported=True, output_chunks=8,
        tokens_per_second=200.0 + index, e2e_tokens_per_second=None, finish_reason="stop",
    )


def test_plot_panels_are_ttft_tokens_per_second_and_e2e_by_the_provider_that_served_them(tmp_path):
    samples = [
        _sample(0, provider="tile-rt"),
        _sample(1, provider="vllm", ttft=None),
        _sample(2, provider="tile-rt"),
        _sample(3, provider="vllm", ok=False),
    ]
    assert served_by(samples) == "tile-rt x2, vllm x1"
    panels = dict(panel_values(samples))
    assert list(panels) == ["time to first token (ms)", "decode tokens/s per request", "end-to-end latency (ms)"]
    assert panels["time to first token (ms)"] == {"tile-rt": [5.0, 5.0]}
    assert panels["end-to-end latency (ms)"] == {"tile-rt": [40.0, 42.0], "vllm": [41.0]}
    write_plot(tmp_path / "p.png", samples, title="t")
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC
