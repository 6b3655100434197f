"""latgate's own commands against real vLLM replicas: ``latgate check --probe`` and
``latgate bench`` through latgate and direct."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from stack import Stack
from vllm_server import SERVED_MODEL, VllmReplica, engine_config

pytestmark = pytest.mark.timeout(300)


def test_check_probe_reaches_both_replicas(both_ready: list[VllmReplica], tmp_path: Path) -> None:
    config = tmp_path / "latgate.toml"
    config.write_text(engine_config([r.url for r in both_ready]))
    done = subprocess.run(
        [sys.executable, "-m", "latgate", "check", "--config", str(config), "--probe"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    probe = done.stdout.split("\nprobe\n", 1)[1]
    for replica in both_ready:
        assert str(replica.port) in probe


def bench(base_url: str, out: Path) -> dict:
    done = subprocess.run(
        [
            sys.executable, "-m", "latgate", "bench", "--base-url", base_url, "--model", SERVED_MODEL,
            "-n", "4", "-c", "2", "--max-tokens", "16", "--prompt-tokens", "64", "--json", str(out),
        ],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return orjson.loads(out.read_bytes())


def test_bench_through_latgate_and_direct(stack: Stack, both_ready: list[VllmReplica], tmp_path: Path) -> None:
    """Both runs succeed and count the same tokens; every request's decode rate stays
    within what one replica can do (a burst is not an infinite rate)."""
    direct = bench(both_ready[0].url, tmp_path / "direct.json")
    through = bench(stack.v1, tmp_path / "through.json")
    for report in (direct, through):
        assert report["totals"]["succeeded"] == 4
        assert report["totals"]["completion_tokens"] == 4 * 16
        assert all(s["usage_reported"] for s in report["samples"])
    assert {s["provider"] for s in through["samples"]} == {"vllm"}
    for sample in direct["samples"] + through["samples"]:
        assert sample["tokens_per_second"] is None or sample["tokens_per_second"] <= 2000
