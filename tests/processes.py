"""Waiting for a condition and stopping a child process, for tests that run servers
(Prometheus, Chromium, redis-server, containers)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(check: Callable[[], T], *, timeout: float, what: str, interval: float = 0.25) -> T:
    """``check()`` until it returns something truthy (returned), for at most ``timeout``
    seconds; AssertionError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def stop(process: subprocess.Popen, *, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it is still running after ``timeout`` seconds; reaped."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
