"""A real redis-server for the shared-state tests, on a free loopback port.

``redis_server()`` starts ``redis-server`` with no persistence, waits for its "Ready to
accept connections" line on stdout (read by a thread, which keeps draining the pipe; no
polling, no sleeps) and yields its URL; the
process is terminated on exit. Without a ``redis-server`` binary the calling test is
skipped with a message saying how to get one (``.ci/run`` installs it).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
from collections.abc import Iterator

import pytest
from processes import stop
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
def redis_server(*options: str, port: int | None = None) -> Iterator[str]:
    """Run ``redis-server`` on loopback (on ``port``, else a free one) with ``options``
    added to its command line (``"--requirepass", "pw"``); yields ``redis://127.0.0.1:PORT/0``."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip(
            "redis-server is not installed: `apt-get install redis-server` (.ci/run does it) to run the Redis tests"
        )
    port = port or free_port()
    args = [
        exe,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        *options,
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready = threading.Event()
    seen: list[str] = []

    def drain() -> None:  # reads every line, so the pipe never fills; flags the ready line
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if READY_LINE in line:
                ready.set()
        ready.set()  # EOF: redis-server exited

    reader = threading.Thread(target=drain, name="redis-server-output", daemon=True)
    reader.start()
    try:
        if not ready.wait(START_TIMEOUT_SECONDS) or proc.poll() is not None:
            raise RuntimeError("redis-server did not start: " + "".join(seen[-5:]))
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(proc, timeout=10)
        reader.join(timeout=10)
