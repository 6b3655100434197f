"""Each agent's set-up, as a new user would do it, pointed at latgate (see docs/clients.md,
"Coding agents"): configuration files written into the sandbox's HOME, environment
variables, and the non-interactive command line of one turn.

Permissions are the narrowest each CLI offers for running a tool unattended:

- Codex: ``approval_policy = "never"`` with the ``workspace-write`` sandbox (its own
  bubblewrap/landlock sandbox: writes only to the working folder, no network; /tmp and
  TMPDIR excluded).
- Claude Code: ``-p`` with ``--allowedTools Bash`` and ``--permission-mode dontAsk``
  (tools not allowed are refused, never prompted for).
- Cline and Qwen Code have no OS sandbox: auto-approve (Cline's default for a prompt on
  the command line, Qwen's ``--approval-mode yolo``) inside the scratch HOME and
  working folder; the simulator only ever asks them for their shell tool with a no-op
  command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agents.sandbox import Sandbox

API_KEY = "sk-latgate-agent-test"
PROMPT = "List the files in this folder with your shell tool, then say what you found."
FOLLOW_UP = "Now list them again and say goodbye."
#: Each agent's shell tool, which the simulator calls (``SimOptions.preferred_tools``).
SHELL_TOOLS = ("exec_command", "shell", "run_shell_command", "run_commands", "execute_command", "Bash")


@dataclass(frozen=True)
class AgentCommand:
    """``prepare`` commands run first (e.g. ``cline auth``), then ``turn``, with ``env``;
    ``follow_up``, when the CLI can resume its last session non-interactively, is a
    second turn of the same session."""

    turn: list[str]
    env: dict[str, str]
    prepare: tuple[list[str], ...] = ()
    follow_up: list[str] | None = None


def codex(sandbox: Sandbox, *, command: Path, base_url: str, model: str) -> AgentCommand:
    """``codex exec`` with a ``[model_providers.latgate]`` entry (``wire_api = "responses"``)."""
    codex_home = sandbox.home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f"""model = "{model}"
model_provider = "latgate"
approval_policy = "never"
sandbox_mode = "workspace-write"
check_for_update_on_startup = false

[features]
plugins = false
apps = false

[analytics]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"

[sandbox_workspace_write]
network_access = false
exclude_tmpdir_env_var = true
exclude_slash_tmp = true

[model_providers.latgate]
name = "latgate"
base_url = "{base_url}/v1"
env_key = "LATGATE_API_KEY"
wire_api = "responses"
"""
    )
    exec_ = [
        str(command),
        "exec",
        "--skip-git-repo-check",
        "--color",
        "never",
        "--sandbox",
        "workspace-write",
    ]
    exec_ += ["-C", str(sandbox.work)]
    env = {"CODEX_HOME": str(codex_home), "LATGATE_API_KEY": API_KEY}
    return AgentCommand(turn=[*exec_, PROMPT], env=env, follow_up=[*exec_, "resume", "--last", FOLLOW_UP])


def cline(sandbox: Sandbox, *, command: Path, base_url: str, model: str) -> AgentCommand:
    """``cline auth -p openai -b URL/v1 -k KEY -m MODEL``, then ``cline -P openai -m MODEL "…"``."""
    auth = [str(command), "auth", "-p", "openai", "-b", f"{base_url}/v1", "-k", API_KEY, "-m", model]
    turn = [str(command), "-P", "openai", "-m", model, "-c", str(sandbox.work), PROMPT]
    return AgentCommand(turn=turn, env={}, prepare=(auth,))


def qwen(sandbox: Sandbox, *, command: Path, base_url: str, model: str) -> AgentCommand:
    """``qwen --approval-mode yolo "…"`` with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``."""
    settings = {
        "security": {"auth": {"selectedType": "openai"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    }
    folder = sandbox.home / ".qwen"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(json.dumps(settings, indent=2))
    env = {"OPENAI_BASE_URL": f"{base_url}/v1", "OPENAI_API_KEY": API_KEY, "OPENAI_MODEL": model}
    return AgentCommand(turn=[str(command), "--approval-mode", "yolo", PROMPT], env=env)


def claude(sandbox: Sandbox, *, command: Path, base_url: str, model: str) -> AgentCommand:
    """``claude -p "…"`` with ``ANTHROPIC_BASE_URL`` (no ``/v1``) and ``ANTHROPIC_API_KEY``;
    the follow-up is ``claude -p --continue "…"``."""
    options = ["--model", model, "--allowedTools", "Bash", "--permission-mode", "dontAsk"]
    env = {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": API_KEY}
    follow_up = [str(command), "-p", FOLLOW_UP, "--continue", *options]
    return AgentCommand(turn=[str(command), "-p", PROMPT, *options], env=env, follow_up=follow_up)


SETUPS: dict[str, Callable[..., AgentCommand]] = {
    "codex": codex,
    "cline": cline,
    "qwen": qwen,
    "claude": claude,
}
