"""A real redis-server for the shared-state tests, on a free loopback port.

``redis_server()`` starts ``redis-server`` with no persistence, waits for its "Ready to
accept connections" line on stdout (no polling, no sleeps) and yields its URL; the
process is terminated on exit. Without a ``redis-server`` binary the calling test is
skipped with a message saying how to get one (``.ci/run`` installs it).
"""

from __future__ import annotations

import contextlib
import selectors
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from servers import listening_socket

READY_LINE = "Ready to accept connections"
START_TIMEOUT_SECONDS = 15.0


def free_port() -> int:
    sock = listening_socket()
    try:
        return sock.getsockname()[1]
    finally:
        sock.close()


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """Run ``redis-server`` on loopback; yields ``redis://127.0.0.1:PORT/0``."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed: `apt-get install redis-server` (.ci/run does it) to run the Redis tests")
    port = free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_ready(proc)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=deadline - time.monotonic()):
                break
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if READY_LINE in line:
                return
    raise RuntimeError("redis-server did not start: " + "".join(seen[-5:]))
