"""``[routing.queue]`` and the priority keys as a user writes them: ``latgate check``
shows every value in force and names a mistake."""

from __future__ import annotations

from pathlib import Path

from test_check_cli import run_check

BASE = """
[providers.vllm]
api_base = "http://127.0.0.1:9/v1"
models = ["m"]
max_batch_size = 8
"""


def test_check_shows_the_queue_and_retry_budget_with_their_defaults(tmp_path: Path) -> None:
    config = tmp_path / "latgate.toml"
    config.write_text(BASE + "\n[routing.queue]\nmax_waiting = 10\n")
    result = run_check("--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "max_waiting 10, max_wait_ms 30000, batch_max_wait_ms 10000, batch_headroom_slots 1, preempt true" in result.stdout
    assert "retry_budget_percent 20.0, retry_budget_min 3, hedge_slow_share 0.5" in result.stdout


def test_check_names_a_priority_that_is_not_a_class(tmp_path: Path) -> None:
    config = tmp_path / "latgate.toml"
    config.write_text(BASE + '\n[[auth.keys]]\nname = "a"\nkey = "sk-a"\npriority = "urgent"\n[routing.policies.p]\npriority = "low"\n')
    result = run_check("--config", str(config))
    assert result.returncode != 0
    assert "auth.keys[0].priority: input should be 'interactive', 'default' or 'batch'" in result.stderr
    assert "routing.policies.p.priority" in result.stderr
