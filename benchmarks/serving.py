"""What the benchmarks share to start latgate on loopback: a free port, the
``latgate serve`` command line (run with this interpreter), and the simulators' child
process (ASGI apps served on one event loop)."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def latgate_serve_command(config: Path, *, port: int, log_level: str | None = None) -> list[str]:
    """``latgate serve --config CONFIG --port PORT [--log-level LEVEL]`` as an argv list."""
    command = [sys.executable, "-m", "latgate", "serve", "--config", str(config), "--port", str(port)]
    return command + (["--log-level", log_level] if log_level else [])


def serve_apps(apps: dict[int, Any]) -> None:
    """Serve each ASGI app on ``127.0.0.1:PORT`` (``{port: app}``), all on one event loop
    under uvicorn (no lifespan, no access log), until the process is killed: the body of
    a benchmark's ``--serve-sims`` child process."""
    import uvicorn

    async def main() -> None:
        servers = [
            uvicorn.Server(
                uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", access_log=False)
            )
            for port, app in apps.items()
        ]
        await asyncio.gather(*(server.serve() for server in servers))

    asyncio.run(main())
