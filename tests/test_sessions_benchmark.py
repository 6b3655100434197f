"""benchmarks/sessions.py: its sessions, its summary, and a tiny end-to-end run (the
full benchmark takes minutes and is not part of the suite)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import orjson
import pytest

from latgate.routing.tokens import estimate_prompt_tokens

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("sessions_bench", BENCHMARKS / "sessions.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sessions_bench"] = module
    spec.loader.exec_module(module)
    return module


def test_sessions_share_the_system_prompt_and_grow_by_a_turn_each_time(bench) -> None:
    workload = bench.Workload(sessions=3, turns=4, system_tokens=2_000, turn_tokens=400)
    plans = bench.make_sessions(workload, seed=5)
    assert [p.bodies for p in plans] == [p.bodies for p in bench.make_sessions(workload, seed=5)]
    systems = set()
    for plan in plans:
        bodies = [orjson.loads(b) for b in plan.bodies]
        systems.add(bodies[0]["messages"][0]["content"])
        assert bodies[0]["messages"][1]["content"].startswith(f"SESSIONMARK{plan.index:04d} ")
        for earlier, later in itertools.pairwise(bodies):
            assert later["messages"][: len(earlier["messages"])] == earlier["messages"]
            grown = estimate_prompt_tokens(later) - estimate_prompt_tokens(earlier)
            assert 300 < grown < 500
    assert len(systems) == 1 and 1_500 < estimate_prompt_tokens({"messages": [{"content": systems.pop()}]}) < 2_500


def test_the_summary_counts_turns_per_endpoint_and_the_cache_from_the_simulators(bench) -> None:
    result = bench.Result(
        kind="0", ok=True, ttft_s=0.1, completion_tokens=4, provider=None, reason=None,
        candidates=None, sent_at=0.0, done_at=1.0, error=None,
    )  # fmt: skip
    observed = {
        "results": [(0, t, result) for t in range(4)] + [(1, t, result) for t in range(4)],
        "sims": {
            "r0": {"queried": 1000, "hit": 600, "served": [0, 0, 0, 1, -1]},
            "r1": {"queried": 1000, "hit": 200, "served": [0, 1, 1, 1]},
            "r2": {"queried": 0, "hit": 0, "served": []},
            "r3": {"queried": 0, "hit": 0, "served": []},
        },
        "elapsed_s": 1.0,
    }
    row = bench.summarize(observed, sessions=2)
    assert row["on_most_used"] == 0.75 and row["on_most_used_min"] == 0.75
    assert row["requests"] == {"r0": 4, "r1": 4, "r2": 0, "r3": 0} and row["max_share"] == 2.0
    assert row["from_cache"] == 0.4 and row["ttft_p99_s"] == 0.1 and row["errors"] == 0


def test_a_tiny_run_writes_the_json_with_latgate_and_the_oracle(bench, tmp_path: Path) -> None:
    out = tmp_path / "sessions.json"
    argv = ["--sessions", "2", "--turns", "2", "--think-seconds", "0", "--system-tokens", "600",
            "--turn-tokens", "200", "--systems", "latgate,oracle", "--replicas", "equal",
            "--headers", "on", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    case = json.loads(out.read_text())["cases"]["equal-headers-on"]
    latgate, oracle = case["systems"]["latgate"], case["systems"]["oracle"]
    assert latgate["turns"] == oracle["turns"] == 4 and latgate["errors"] == oracle["errors"] == 0
    assert oracle["on_most_used"] == 1.0 and oracle["requests"] == {"r0": 2, "r1": 2, "r2": 0, "r3": 0}
    assert oracle["from_cache"] > 0.3  # each second turn reuses its first turn's blocks
    assert sum(latgate["requests"].values()) == 4 and latgate["ttft_p99_s"] > 0
    assert set(case["targets"]) >= {"on_most_used", "max_share", "from_cache_vs_oracle"}


def test_the_default_workload_is_the_issue_s_shape_and_quick_is_a_third_of_it(bench) -> None:
    full, quick = bench.Workload(), bench.QUICK
    assert (full.sessions * full.turns, full.system_tokens, full.turn_tokens, full.cache_tokens) == (480, 8_000, 1_600, 400_000)
    assert quick.turns * 3 == full.turns and quick.sessions == full.sessions
    # each holds its four sessions' final histories with the same room to spare
    assert abs(full.cache_tokens / (4 * full.longest_history_tokens) - quick.cache_tokens / (4 * quick.longest_history_tokens)) < 0.15


def test_the_slowdown_counts_the_slowed_replica_s_later_turns_that_waited_past_an_uncached_prefill_elsewhere(bench) -> None:
    def result(ttft_s: float):
        return bench.Result(
            kind="0", ok=True, ttft_s=ttft_s, completion_tokens=4, provider=None, reason=None,
            candidates=None, sent_at=0.0, done_at=1.0, error=None,
        )  # fmt: skip

    # session 0: turns 0, 1 on r3 (turn 1 after it slowed at t=10), turn 2 moved to r0;
    # session 1: all on r1. 20k prompt tokens cost 0.01 + 1.0 s uncached elsewhere.
    ttfts = {(0, 0): 0.1, (0, 1): 1.5, (0, 2): 1.2, (1, 0): 0.1, (1, 1): 0.1, (1, 2): 0.1}
    observed = {
        "results": [(index, turn, result(t)) for (index, turn), t in ttfts.items()],
        "sims": {
            "r0": {"served": [0], "served_at": [12.0], "slowed_at": None},
            "r1": {"served": [1, 1, 1, -1], "served_at": [1.0, 5.0, 11.0, 2.0], "slowed_at": None},
            "r2": {"served": [], "served_at": [], "slowed_at": None},
            "r3": {"served": [0, 0], "served_at": [1.0, 10.5], "slowed_at": 10.0},
        },
    }
    row = bench.slowdown(observed, dict.fromkeys(ttfts, 20_000))
    assert row["slowed_share_before"] == 0.333 and row["slowed_share_after"] == 0.333
    assert row["slowed_turns_after"] == 1 and row["waits_past_uncached"] == 1 and row["worst_excess_s"] == 0.49
    assert bench.slowdown({**observed, "sims": {**observed["sims"], "r3": {**observed["sims"]["r3"], "slowed_at": None}}}, {}) == {}
