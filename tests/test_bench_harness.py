"""benchmarks/harness.py: the one percentile definition, seeded arrivals, strict JSON;
tools/bench_imports.py: no import cycle and no patched module global in benchmarks/."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import random
import sys
from pathlib import Path

import pytest

from latgate.commands.bench.stats import percentile as latgate_percentile

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCHMARKS))
    return _load(BENCHMARKS / "harness.py", "harness")


@pytest.fixture(scope="module")
def imports_check():
    return _load(ROOT / "tools" / "bench_imports.py", "bench_imports")


def test_the_percentile_is_latgate_bench_s_linear_interpolation(harness) -> None:
    values = [0.4, 0.1, 0.3, 0.2]
    assert harness.percentile(values, 50) == pytest.approx(0.25)  # nearest rank would say 0.2
    assert harness.percentile(range(1, 11), 90) == pytest.approx(9.1)
    assert harness.percentile([7.0], 99) == 7.0
    rng = random.Random(3)
    sample = [rng.random() for _ in range(37)]
    for q in (0, 1, 25, 50, 90, 99, 100):
        assert harness.percentile(sample, q) == latgate_percentile(sorted(sample), q)


def test_a_percentile_of_nothing_is_the_given_empty_value_and_q_is_checked(harness) -> None:
    assert harness.percentile([], 99) is None
    assert math.isnan(harness.percentile([], 50, empty=math.nan))
    with pytest.raises(ValueError):
        harness.percentile([1.0], 101)


def test_no_benchmark_defines_a_percentile_of_its_own() -> None:
    own = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and (node.name == "pct" or any(w in node.name for w in ("percentile", "quantile", "median"))):
                own.append(f"{path.name}:{node.name}")
            if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") in ("p50", "p90", "p95", "p99"):
                own.append(f"{path.name}:{node.name}")
            if isinstance(node, ast.Attribute) and node.attr in ("quantiles", "median", "percentile", "quantile"):
                own.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert own == ["harness.py:percentile"]


def test_poisson_times_are_the_same_for_a_seed_ascending_and_thinned(harness) -> None:
    times = list(harness.poisson_times(random.Random(5), duration_s=100.0, rate=10.0))
    assert times == list(harness.poisson_times(random.Random(5), duration_s=100.0, rate=10.0))
    assert times == sorted(times) and 0 < times[0] and times[-1] < 100.0
    assert 850 < len(times) < 1150
    second_half = list(harness.poisson_times(random.Random(5), duration_s=100.0, rate=lambda t: 0.0 if t < 50 else 10.0, peak=10.0))
    assert second_half and min(second_half) >= 50.0
    assert 400 < len(second_half) < 600
    with pytest.raises(ValueError):
        next(harness.poisson_times(random.Random(5), duration_s=1.0, rate=lambda t: 1.0))


def test_json_documents_are_strict_and_tables_are_markdown(harness, tmp_path: Path) -> None:
    out = tmp_path / "doc.json"
    harness.write_json(out, {"p99_ms": math.nan, "rows": [1.5, math.nan]})
    assert json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict {c}")) == {"p99_ms": None, "rows": [1.5, None]}
    assert harness.markdown_table(["system", "p99"], [["latgate", 0.1]]) == "| system | p99 |\n|---|---|\n| latgate | 0.1 |"


def test_the_routing_report_computes_its_percentiles_by_the_harness(harness) -> None:
    report = _load(BENCHMARKS / "routing_report.py", "routing_report")
    fields = {"kind": "ls", "ok": True, "completion_tokens": 1, "provider": "p", "reason": None, "candidates": None}
    fields |= {"sent_at": 0.0, "done_at": 1.0, "error": None}
    results = [harness.Result(ttft_s=t, **fields) for t in (0.1, 0.2, 0.3, 0.4)]
    row = report.summarize("full", 250, {"results": results, "arrivals": {}}, {})
    assert row["ls_p50_s"] == 0.25 and row["ls_p99_s"] == pytest.approx(0.397)
    assert row["slo"] == 0.5


def test_benchmarks_have_no_import_cycle_and_no_patched_module_global(imports_check) -> None:
    graph = imports_check.import_graph(BENCHMARKS)
    assert imports_check.cycles(graph) == []
    assert imports_check.patched_globals(BENCHMARKS) == []
    assert "harness" in graph["routing_scenarios"] and "routing_slo" not in graph["routing_scenarios"]


def test_the_check_finds_a_cycle_through_a_function_level_import_and_a_patched_global(imports_check, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from c import x\n    return x\n")
    (tmp_path / "c.py").write_text("import a\nx = 1\n")
    (tmp_path / "d.py").write_text("import a\nimport json\na.value = 2\n")
    assert imports_check.cycles(imports_check.import_graph(tmp_path)) == [["a", "b", "c"]]
    assert imports_check.patched_globals(tmp_path) == ["d.py:3: a.value"]
    assert imports_check.main([str(tmp_path)]) == 1
