"""Running one agent turn as a bounded subprocess and cleaning up after it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from agents.sandbox import MARKER, Sandbox


@dataclass(frozen=True)
class AgentRun:
    """What one run did: exit code (``None`` when it hit the timeout), output, wall time
    (``started_at`` is ``time.perf_counter()`` seconds)."""

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    started_at: float

    def summary(self, *, lines: int = 15) -> str:
        """The command, exit code and the last ``lines`` of each stream (for assertion messages)."""
        tail_out = "\n".join(self.stdout.strip().splitlines()[-lines:])
        tail_err = "\n".join(self.stderr.strip().splitlines()[-lines:])
        return f"$ {' '.join(self.argv[:3])} ... -> exit {self.returncode} in {self.seconds:.1f}s\n--- stdout\n{tail_out}\n--- stderr\n{tail_err}"


def run_agent(argv: list[str], *, sandbox: Sandbox, env: dict[str, str], timeout_seconds: float) -> AgentRun:
    """Run ``argv`` in ``sandbox.work`` with ``env``, stdin closed, for at most ``timeout_seconds``.

    The agent gets its own session (process group); on timeout the group is killed. Any
    process still carrying the sandbox marker afterwards (daemons that detached) is
    ended too, by id.
    """
    started = time.perf_counter()
    process = subprocess.Popen(
        argv,
        cwd=sandbox.work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_seconds)
        returncode: int | None = process.returncode
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        stdout, stderr = process.communicate()
        returncode = None
    finally:
        end_leftovers(sandbox)
    seconds = time.perf_counter() - started
    return AgentRun(
        argv=argv, returncode=returncode, stdout=stdout, stderr=stderr, seconds=seconds, started_at=started
    )


def end_leftovers(sandbox: Sandbox) -> list[int]:
    """End processes whose environment carries this sandbox's marker; returns their ids."""
    marker = f"{MARKER}={sandbox.root}".encode()
    ended = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                ended.append(int(entry.name))
            except OSError:
                pass
    return ended


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
