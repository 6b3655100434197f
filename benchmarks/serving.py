"""What the benchmarks share to start latgate on loopback: a free port and the
``latgate serve`` command line (run with this interpreter)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def latgate_serve_command(config: Path, *, port: int, log_level: str | None = None) -> list[str]:
    """``latgate serve --config CONFIG --port PORT [--log-level LEVEL]`` as an argv list."""
    command = [sys.executable, "-m", "latgate", "serve", "--config", str(config), "--port", str(port)]
    return command + (["--log-level", log_level] if log_level else [])
