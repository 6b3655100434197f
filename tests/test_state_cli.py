"""``[state]`` as the CLI shows it: a malformed ``redis_url`` is a config error in
``check`` and ``serve`` (one ``latgate: error:`` line naming ``state.redis_url``, its
password masked, no traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PASSWORD = "hunter2-s3cret"
PROVIDER = '[providers.a]\nbase_url = "http://127.0.0.1:9/v1"\nmodels = ["m"]\n'
BAD_URLS = [
    (f"redis://:{PASSWORD}@127.0.0.1:16399/abc", "database"),
    (f"redis://:{PASSWORD}@127.0.0.1:16399/0/extra", "database"),
    (f"redis://:{PASSWORD}@127.0.0.1:99999/0", "port"),
    (f"redis://:{PASSWORD}@127.0.0.1:0/0", "port"),
]


def latgate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "latgate", *args],
        check=False,  # the exit code is asserted
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", ["check", "serve"])
@pytest.mark.parametrize(("url", "part"), BAD_URLS)
def test_a_malformed_redis_url_is_one_masked_config_error(tmp_path, command, url, part) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'{PROVIDER}[state]\nredis_url = "{url}"\n')
    result = latgate(command, "--config", str(cfg))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines and all(line.startswith("latgate: error:") for line in lines), result.stderr
    assert "state.redis_url" in lines[0] and part in lines[0] and "redis://HOST:6379/0" in lines[0]
    assert "redis://:***@127.0.0.1" in lines[0]
    assert PASSWORD not in result.stderr + result.stdout and "Traceback" not in result.stderr
