"""Pinned agent CLIs from the npm registry, installed once into a cache folder.

The cache is ``$LATGATE_AGENTS_CACHE`` or ``~/.cache/latgate-agents``, one folder per
package and version (``codex-0.171.0/``). An install goes to a ``.partial`` folder that
is renamed when complete, under a file lock, so concurrent or interrupted runs never
see half an install. Later runs find the folder and start at once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

INSTALL_TIMEOUT_SECONDS = 420


@dataclass(frozen=True)
class Pin:
    """One agent CLI: its npm package, pinned version and the command it installs."""

    name: str
    package: str
    version: str
    command: str

    @property
    def folder(self) -> str:
        return f"{self.name}-{self.version}"


#: Versions current when these tests were written (``npm view NAME version``).
PINS = {
    "codex": Pin("codex", "@openai/codex", "0.171.0", "codex"),
    "cline": Pin("cline", "cline", "3.0.65", "cline"),
    "qwen": Pin("qwen", "@qwen-code/qwen-code", "0.24.4", "qwen"),
    "claude": Pin("claude", "@anthropic-ai/claude-code", "2.1.332", "claude"),
}


class AgentUnavailable(Exception):
    """The agent cannot run here (no node/npm, or the install failed); the message says why."""


def cache_root() -> Path:
    """Where installs are kept."""
    configured = os.environ.get("LATGATE_AGENTS_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "latgate-agents"


def node_missing() -> str | None:
    """Why agents cannot run here, or ``None`` when ``node`` and ``npm`` are on PATH."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH: the real-agent tests need Node.js (apt-get install nodejs npm)"
    return None


def install(pin: Pin) -> Path:
    """The path of ``pin``'s command, installing the package first when not cached.

    Raises:
        AgentUnavailable: ``node``/``npm`` missing, or ``npm install`` failed or timed out.
    """
    reason = node_missing()
    if reason:
        raise AgentUnavailable(reason)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / pin.folder
    command = final / "node_modules" / ".bin" / pin.command
    if command.exists():
        return command
    with open(root / f"{pin.folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if command.exists():
            return command
        partial = root / f"{pin.folder}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        argv = [
            "npm",
            "install",
            "--prefix",
            str(partial),
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--loglevel=error",
        ]
        env = {**os.environ, "npm_config_update_notifier": "false", "NO_UPDATE_NOTIFIER": "1"}
        try:
            done = subprocess.run(
                [*argv, f"{pin.package}@{pin.version}"],
                cwd=partial,
                env=env,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT_SECONDS,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise AgentUnavailable(f"npm install {pin.package}@{pin.version} timed out") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise AgentUnavailable(f"npm install {pin.package}@{pin.version} failed: {' | '.join(tail)}")
        partial.rename(final)
    if not command.exists():
        raise AgentUnavailable(f"{pin.package}@{pin.version} installed no {pin.command!r} command")
    return command
