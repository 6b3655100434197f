"""benchmarks/routing_slo.py: its trace, summary and config, and a two-second smoke run
(the full benchmark takes minutes and is not part of the suite)."""

from __future__ import annotations

import collections
import importlib.util
import json
import sys
from pathlib import Path

import orjson
import pytest

from latgate.foundation.config import load_config_text
from latgate.routing.tokens import estimate_prompt_tokens

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "routing_slo.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("routing_slo", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["routing_slo"] = module
    spec.loader.exec_module(module)
    return module


def test_the_trace_is_the_same_for_a_seed_and_has_the_stated_mix(bench) -> None:
    trace = bench.make_trace(seed=3, duration_s=60.0)
    assert [(a.at_s, a.body) for a in trace] == [
        (a.at_s, a.body) for a in bench.make_trace(seed=3, duration_s=60.0)
    ]
    mix = collections.Counter(a.kind for a in trace)
    total = len(trace)
    assert 800 < total < 1500
    assert abs(mix["ls"] / total - 0.40) < 0.06 and abs(mix["ordinary"] / total - 0.45) < 0.06
    assert abs(mix["long"] / total - 0.15) < 0.05
    in_bursts = sum(1 for a in trace if bench.arrival_rate(a.at_s) == bench.BURST_RATE)
    assert in_bursts > total / 2, "most requests arrive in the bursts"


def test_long_requests_are_long_context_and_latency_sensitive_ones_are_short(bench) -> None:
    trace = bench.make_trace(seed=3, duration_s=20.0)
    for arrival in trace:
        tokens = estimate_prompt_tokens(orjson.loads(arrival.body))
        if arrival.kind == "long":
            assert tokens > 16384
        elif arrival.kind == "ls":
            assert tokens < 1000 and arrival.headers["x-latency-budget-ms"] == "200"


def test_the_config_loads_for_every_strategy(bench) -> None:
    for strategy in bench.STRATEGIES:
        text = bench.CONFIG
        for index, name in enumerate(bench.SIMS):
            text = text.replace("{" + name + "}", f"http://127.0.0.1:{9000 + index}")
        config = load_config_text(
            text.replace("{strategy}", strategy).replace("{{", "{").replace("}}", "}"), source="bench"
        )
        assert config.routing.strategy == strategy and len(config.providers["tile-rt"].endpoints) == 2


def result(bench, kind: str, ttft_s: float | None, *, ok: bool = True, tokens: int = 10):
    return bench.Result(
        kind=kind, ok=ok, ttft_s=ttft_s, completion_tokens=tokens, provider="p", reason="r",
        candidates=None, sent_at=0.0, done_at=2.0, error=None if ok else "http_502",
    )  # fmt: skip


def test_attainment_counts_failures_as_misses(bench) -> None:
    rows = [result(bench, "ls", 0.05), result(bench, "ls", 0.25), result(bench, "ls", None, ok=False)]
    rows.append(result(bench, "ordinary", 0.9, tokens=30))
    summary = bench.summarize(rows)
    assert summary["slo_attainment"] == pytest.approx(1 / 3, abs=1e-3)
    # benchmarks/harness.py's percentiles: linear interpolation between the closest ranks
    assert summary["ls_ttft_p50_s"] == pytest.approx(0.15) and summary["ls_ttft_p99_s"] == pytest.approx(0.248)
    assert summary["all_ttft_p99_s"] == pytest.approx(0.887) and summary["errors"] == 1
    assert summary["throughput_tok_s"] == pytest.approx(50 / 2.0)


def test_a_two_second_run_writes_the_json_and_the_plot(bench, tmp_path: Path) -> None:
    out = tmp_path / "slo.json"
    argv = ["--duration", "2", "--strategies", "latgate", "--no-routing-cost", "--json", str(out)]
    assert bench.main(argv) == 0
    document = json.loads(out.read_text())
    assert set(document["strategies"]) == {"latgate"}
    for row in document["strategies"].values():
        assert set(row) >= {
            "slo_attainment",
            "ls_ttft_p50_s",
            "ls_ttft_p99_s",
            "all_ttft_p99_s",
            "throughput_tok_s",
            "errors",
        }
        assert row["errors"] == 0
    assert out.with_suffix(".png").stat().st_size > 0
