"""The fast suite (``make test``, plain ``pytest``) collects no test of a slow tier: the
real agent CLIs (~1.4 GB from npm) run only under ``make test-agents``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def collected(*args: str, tier: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LATGATE_TIER"}
    if tier is not None:
        env["LATGATE_TIER"] = tier
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *args],
        check=False,  # the exit code is asserted
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


def test_the_fast_suite_collects_no_agent_cli_test() -> None:
    result = collected("-m", "agents")  # the whole suite, as make test collects it
    assert result.returncode == 5, result.stdout + result.stderr  # 5: no tests collected


def test_make_test_agents_collects_every_agent_cli_test() -> None:
    result = collected("-m", "agents", "tests/agents", tier="agents")
    assert result.returncode == 0, result.stdout + result.stderr
    names = [line for line in result.stdout.splitlines() if "::test_" in line]
    assert any("codex" in n for n in names) and any("claude_code" in n for n in names), names


def test_make_test_says_what_it_downloads_before_it_runs() -> None:
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "test", "test-agents"],
        check=True, capture_output=True, text=True, cwd=ROOT, timeout=30,
    )  # fmt: skip
    echoes = [line for line in result.stdout.splitlines() if line.startswith("echo ")]
    assert "1.4 GB" in echoes[0] and "make test-agents" in echoes[0], result.stdout
    assert "LATGATE_TIER=agents" in result.stdout
