"""The soak benchmark, short: mixed traffic with injected upstream faults for a few
seconds (the full run takes minutes: ``benchmarks/soak.py``). Every request ends in a
clear status, none in a 500, nothing stays in flight, and memory is sampled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


def test_short_soak_with_injected_faults_ends_clean(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    args = ["--duration-seconds", "4", "--sample-seconds", "1", "--concurrency", "4", "--max-growth-mb", "64"]
    result = subprocess.run(
        [sys.executable, str(SOAK), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    outcomes = report["outcomes"]
    assert report["requests"] > 50
    assert "internal_error" not in outcomes and "transport" not in outcomes
    assert {"200", "400", "401", "abandoned"} <= set(outcomes)
    assert report["in_flight_after"] == 0
    assert len(report["samples"]) >= 3 and all(s["rss_mb"] > 0 for s in report["samples"])
    assert "flat" in report["memory"] and "Traceback" not in result.stderr
