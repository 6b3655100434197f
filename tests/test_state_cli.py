"""``[state]`` as the CLI shows it: a malformed ``redis_url`` is a config error in
``check`` and ``serve`` (one ``latgate: error:`` line naming ``state.redis_url``, its
password masked, no traceback); ``check`` shows the shared store and ``--probe`` logs in
to it; a refused Redis login is logged as an authentication failure, not as
unreachable."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys

import pytest
from redisd import free_port, redis_server

from latgate.live.store import Quota, RedisStore, StoreUnavailable

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


@pytest.fixture(scope="module")
def locked_redis():
    """A real redis-server with ``--requirepass``: its URL without a password."""
    with redis_server("--requirepass", PASSWORD) as url:
        yield url


def with_password(url: str, password: str) -> str:
    return url.replace("redis://", f"redis://:{password}@")


def test_check_shows_the_shared_store_masked_and_in_process_state_without_it(tmp_path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(PROVIDER)
    assert "in-process" in latgate("check", "--config", str(cfg)).stdout
    cfg.write_text(
        f'{PROVIDER}[state]\nredis_url = "redis://:{PASSWORD}@127.0.0.1:6390/0"\nfail_open = false\n'
    )
    result = latgate("check", "--config", str(cfg))
    assert result.returncode == 0, result.stderr
    assert (
        "shared store redis://:***@127.0.0.1:6390/0" in result.stdout and "fail_open: false" in result.stdout
    )
    assert PASSWORD not in result.stdout


@pytest.mark.parametrize(
    ("password", "shown"),
    [
        (PASSWORD, "ok"),
        (None, "authentication failed (NOAUTH"),
        ("wrong-pass", "authentication failed (WRONGPASS"),
    ],
)
def test_check_probe_logs_in_to_the_shared_store(tmp_path, locked_redis, password, shown) -> None:
    url = with_password(locked_redis, password) if password else locked_redis
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'{PROVIDER}[state]\nredis_url = "{url}"\n')
    result = latgate("check", "--config", str(cfg), "--probe")
    assert result.returncode == 2  # the provider at 127.0.0.1:9 fails its probe either way
    probed = result.stdout.split("\nprobe\n", 1)[1]
    line = next(line for line in probed.splitlines() if "shared store" in line)
    assert (line.split()[0] == "ok") if shown == "ok" else (line.split()[0] == "failed" and shown in line), (
        probed
    )
    assert PASSWORD not in result.stdout + result.stderr and "wrong-pass" not in result.stdout


def test_check_probe_reports_an_unreachable_shared_store(tmp_path) -> None:
    port = free_port()
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'{PROVIDER}[state]\nredis_url = "redis://127.0.0.1:{port}/0"\n')
    result = latgate("check", "--config", str(cfg), "--probe")
    assert result.returncode == 2
    assert re.search(
        r"failed +shared store +redis://127.0.0.1:\d+/0  unreachable \(cannot connect", result.stdout
    )


@pytest.mark.parametrize(("password", "code"), [(None, "NOAUTH"), ("wrong-pass", "WRONGPASS")])
def test_a_refused_redis_login_is_logged_as_an_authentication_failure(
    locked_redis, password, code, caplog
) -> None:
    url = with_password(locked_redis, password) if password else locked_redis
    caplog.set_level(logging.WARNING, logger="latgate.store")

    async def scenario() -> None:
        store = RedisStore(url=url, timeout_seconds=5)
        with pytest.raises(StoreUnavailable):
            await store.acquire([Quota(key="k", limit=1, cost=1)])
        await store.aclose()

    asyncio.run(scenario())
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert f"authentication failed ({code}:" in text and "unreachable" not in text
    assert "wrong-pass" not in text and PASSWORD not in text


def test_the_right_password_logs_in(locked_redis) -> None:
    async def scenario() -> object:
        store = RedisStore(url=with_password(locked_redis, PASSWORD), timeout_seconds=5)
        verdict = await store.acquire([Quota(key="k", limit=1, cost=1)])
        await store.aclose()
        return verdict

    assert asyncio.run(scenario()).allowed
