"""A throw-away home for one agent run: HOME, working folder and TMPDIR inside one temp
folder, and an environment built from scratch.

The environment carries nothing of the caller's but ``PATH`` entries for ``node`` and the
system tools: no real API keys, no proxies, no user config. Telemetry, error reporting
and update checks are switched off by every variable the four CLIs read for it, and the
machine has no route out anyway, so anything they try beyond 127.0.0.1 fails fast.
Every process the run starts carries ``LATGATE_AGENT_SANDBOX=<root>``, so leftovers
(a background daemon) can be found and ended by process id.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

MARKER = "LATGATE_AGENT_SANDBOX"

#: Off switches for telemetry, error reporting and update checks, per CLI.
QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "npm_config_update_notifier": "false",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "OTEL_SDK_DISABLED": "true",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
    "OTEL_TRACES_EXPORTER": "none",
    "CLINE_NO_AUTO_UPDATE": "1",
    "CLINE_SESSION_BACKEND_MODE": "local",
    "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
    "CI": "1",
    "NO_COLOR": "1",
    "TERM": "dumb",
}


@dataclass(frozen=True)
class Sandbox:
    """Folders of one run, all under ``root``: ``home``, ``work`` (the agent's working
    folder, where it may write) and ``tmp``."""

    root: Path
    home: Path
    work: Path
    tmp: Path

    @classmethod
    def create(cls, root: Path) -> Sandbox:
        sandbox = cls(root=root, home=root / "home", work=root / "work", tmp=root / "tmp")
        for folder in (sandbox.home, sandbox.work, sandbox.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        (sandbox.work / "README.md").write_text("# scratch project\n\nA folder for an agent test.\n")
        return sandbox

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        """The full environment for the agent: scratch folders, quiet switches, ``extra``."""
        node = shutil.which("node")
        path = [str(Path(node).parent)] if node else []
        path += [p for p in ("/usr/local/bin", "/usr/bin", "/bin") if p not in path]
        return {
            "PATH": os.pathsep.join(path),
            "HOME": str(self.home),
            "USER": "agent",
            "TMPDIR": str(self.tmp),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "XDG_DATA_HOME": str(self.home / ".local" / "share"),
            "XDG_STATE_HOME": str(self.home / ".local" / "state"),
            "LANG": "C.UTF-8",
            "NO_PROXY": "127.0.0.1,localhost",
            MARKER: str(self.root),
            **QUIET_ENV,
            **extra,
        }
