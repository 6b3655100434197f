"""What each coding client is given by ``latgate clients CLIENT``: one renderer per
client, from :class:`ClientSettings` to the text printed on stdout and the notes printed
on stderr. The command itself (options, config, model and key choice) is
:mod:`latgate.commands.clients`; each client's dialect is described in docs/clients.md.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class ClientSettings:
    """What every client's settings are made of.

    Attributes:
        origin: the gateway's URL without ``/v1`` (``https://gw.example.com``).
        key: the gateway key to present (or a placeholder).
        model: the model name the client asks for.
        fast_model: a model alias marked latency-sensitive, or ``model`` when none is.
        headers: request headers for clients that can send them.
        timeout_ms: how long a client should wait, in milliseconds (the gateway's
            longest upstream read timeout, so the client never gives up first).
    """

    origin: str
    key: str
    model: str
    fast_model: str
    headers: dict[str, str]
    timeout_ms: int

    @property
    def v1(self) -> str:
        return self.origin + "/v1"


def is_public_https(origin: str) -> bool:
    """True for an ``https`` URL whose host is not loopback, private or ``localhost``-like."""
    parts = urlsplit(origin)
    host = parts.hostname or ""
    if parts.scheme != "https" or host == "localhost" or host.endswith((".local", ".internal", ".localhost")):
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "." in host
    return address.is_global


# -- one renderer per client: settings -> (stdout text, notes) -----------------------


def claude_code(s: ClientSettings) -> tuple[str, list[str]]:
    env = {
        "ANTHROPIC_BASE_URL": s.origin,
        "ANTHROPIC_AUTH_TOKEN": s.key,
        "ANTHROPIC_MODEL": s.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": s.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": s.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": s.fast_model,
        "ANTHROPIC_SMALL_FAST_MODEL": s.fast_model,
        "API_TIMEOUT_MS": str(s.timeout_ms),
    }
    if s.headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{name}: {value}" for name, value in s.headers.items())
    notes = [
        "save as ~/.claude/settings.json (or merge its env block); leave ANTHROPIC_API_KEY unset",
        "Claude Code asks for max_tokens up to 32000: set CLAUDE_CODE_MAX_OUTPUT_TOKENS if the engine's context is smaller",
    ]
    return json.dumps({"env": env}, indent=2), notes


#: where the Cline CLI (3.x, ``npm i -g cline``) keeps a provider's settings; ``cline
#: auth`` writes the entry, and ``settings.headers`` of it is sent with every request
CLINE_PROVIDERS_FILE = "~/.cline/data/settings/providers.json"


def cline(s: ClientSettings) -> tuple[str, list[str]]:
    """The Cline CLI's commands (``cline auth`` writes :data:`CLINE_PROVIDERS_FILE`; custom
    headers, which it has no option for, go into that file's ``settings.headers``). The
    VS Code extension reads no ``settings.json`` keys: its panel fields go to stderr."""
    lines = [
        f"# Cline CLI (npm i -g cline): cline auth writes {CLINE_PROVIDERS_FILE}",
        shlex.join(["cline", "auth", "-p", "openai", "-b", s.v1, "-k", s.key, "-m", s.model]),
    ]
    if s.headers:
        edit = (
            "import json, pathlib; "
            'p = pathlib.Path.home() / ".cline/data/settings/providers.json"; '
            "d = json.loads(p.read_text()); "
            f'd["providers"]["openai-compatible"]["settings"]["headers"] = {json.dumps(s.headers)}; '
            "p.write_text(json.dumps(d, indent=2))"
        )
        lines += [
            '# custom headers: cline auth has no option for them; they go in the same file, under "headers"',
            shlex.join(["python3", "-c", edit]),
        ]
    lines.append(f"# then: {shlex.join(['cline', '-P', 'openai', '-m', s.model, 'your task'])}")
    headers = ", ".join(f"{name}: {value}" for name, value in s.headers.items())
    notes = [
        "the VS Code extension reads no settings.json keys: in the Cline panel choose API Provider "
        f'"OpenAI Compatible", Base URL {s.v1}, API Key the gateway key, Model ID {s.model}'
        + (f", Custom Headers {headers}" if headers else "")
        + f", and a request timeout of at least {s.timeout_ms} ms"
    ]
    return "\n".join(lines), notes


def continue_(s: ClientSettings) -> tuple[str, list[str]]:
    def entry(name: str, model: str, roles: str, headers: dict[str, str]) -> list[str]:
        lines = [
            f"  - name: {_yaml(name)}",
            "    provider: openai",
            f"    model: {_yaml(model)}",
            f"    apiBase: {_yaml(s.v1)}",
            f"    apiKey: {_yaml(s.key)}",
            f"    roles: [{roles}]",
        ]
        if headers:
            lines += ["    requestOptions:", "      headers:"]
            lines += [f"        {header}: {_yaml(value)}" for header, value in headers.items()]
        return lines

    lines = ["models:"]
    lines += entry(f"latgate {s.model}", s.model, "chat, edit, apply", s.headers)
    # Autocomplete waits on every keystroke: always latency-sensitive.
    lines += entry(
        f"latgate {s.fast_model} autocomplete",
        s.fast_model,
        "autocomplete",
        {**s.headers, "X-Latency-Sensitive": "1"},
    )
    return "\n".join(lines), ["merge into ~/.continue/config.yaml"]


def cursor(s: ClientSettings) -> tuple[str, list[str]]:
    lines = [
        "Cursor > Settings > Models",
        f"  OpenAI API Key:            {s.key}",
        f"  Override OpenAI Base URL:  {s.v1}",
        f"  Add model:                 {s.model}",
    ]
    notes = [
        "Cursor cannot send custom headers: latency marking comes from the model name or the key's policy"
    ]
    if not is_public_https(s.origin):
        notes.insert(
            0,
            f"Cursor sends requests from its own servers, which cannot reach {s.origin}: put latgate behind "
            "a public HTTPS address (reverse proxy or tunnel) and pass it with --base-url",
        )
    return "\n".join(lines), notes


def _sdk_program(
    s: ClientSettings, module: str, client: str, base_url: str, call: str, extra: str, answer: str
) -> list[str]:
    """The lines of a Python program that sends one ``hello`` through an SDK's ``client``
    class at ``base_url`` (``call``: the method path; ``extra``: its arguments before
    ``messages``; ``answer``: the expression printed)."""
    arguments = [f"base_url={json.dumps(base_url)}", f"api_key={json.dumps(s.key)}"]
    if s.headers:
        arguments.append(f"default_headers={json.dumps(s.headers)}")
    message = json.dumps([{"role": "user", "content": "hello"}])
    return [
        f"from {module} import {client}",
        "",
        f"client = {client}({', '.join(arguments)}, timeout={s.timeout_ms / 1000:g})",
        f"reply = client.{call}(model={json.dumps(s.model)}, {extra}messages={message})",
        f"print({answer})",
    ]


def openai_sdk(s: ClientSettings) -> tuple[str, list[str]]:
    """A Python program for the openai SDK (``base_url`` with ``/v1``; openai-python
    ``OpenAI``), and the ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` exports other
    OpenAI-compatible tools read as a note."""
    lines = _sdk_program(s, "openai", "OpenAI", s.v1, "chat.completions.create", "", "reply.choices[0].message.content")
    exports = f"export OPENAI_BASE_URL={shlex.quote(s.v1)} OPENAI_API_KEY={shlex.quote(s.key)}"
    return "\n".join(lines), [
        "save as a .py file and run it with python (pip install openai)",
        f"other OpenAI-compatible tools read the environment: {exports}",
    ]


def anthropic_sdk(s: ClientSettings) -> tuple[str, list[str]]:
    """A Python program for the anthropic SDK; its ``base_url`` is the origin without
    ``/v1`` (the SDK appends ``/v1/messages``; anthropic-sdk-python ``Anthropic``)."""
    lines = _sdk_program(s, "anthropic", "Anthropic", s.origin, "messages.create", "max_tokens=256, ", "reply.content[0].text")
    return "\n".join(lines), ["save as a .py file and run it with python (pip install anthropic)"]


def qwen_code(s: ClientSettings) -> tuple[str, list[str]]:
    """Shell exports for Qwen Code, which reads an OpenAI-compatible base URL, key and
    model from ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL``."""
    lines = [
        f"export OPENAI_BASE_URL={shlex.quote(s.v1)}",
        f"export OPENAI_API_KEY={shlex.quote(s.key)}",
        f"export OPENAI_MODEL={shlex.quote(s.model)}",
    ]
    notes = ['then: qwen "..." (--approval-mode yolo runs tools unattended)']
    return "\n".join(lines), notes


CODEX_KEY_ENV = "LATGATE_API_KEY"


def codex(s: ClientSettings) -> tuple[str, list[str]]:
    """``~/.codex/config.toml``: a ``[model_providers.latgate]`` on the Responses API
    (Codex speaks no other), its key read from ``$LATGATE_API_KEY`` (Codex config
    reference: ``model_providers``, ``env_key``, ``wire_api``, ``http_headers``)."""
    lines = [
        f"model = {json.dumps(s.model)}",
        'model_provider = "latgate"',
        "",
        "[model_providers.latgate]",
        'name = "latgate"',
        f"base_url = {json.dumps(s.v1)}",
        f'env_key = "{CODEX_KEY_ENV}"',
        'wire_api = "responses"',
        f"stream_idle_timeout_ms = {s.timeout_ms}",
    ]
    if s.headers:
        pairs = ", ".join(f"{json.dumps(name)} = {json.dumps(value)}" for name, value in s.headers.items())
        lines.append(f"http_headers = {{ {pairs} }}")
    notes = [
        "save as ~/.codex/config.toml (or $CODEX_HOME/config.toml), or merge its lines",
        f"then: {CODEX_KEY_ENV}={shlex.quote(s.key)} codex exec \"...\" (or codex for the TUI)",
    ]
    return "\n".join(lines), notes


def _yaml(value: str) -> str:
    """A YAML double-quoted scalar (JSON string escapes are valid YAML ones)."""
    return json.dumps(value)


RENDERERS: dict[str, Callable[[ClientSettings], tuple[str, list[str]]]] = {
    "claude-code": claude_code,
    "cline": cline,
    "codex": codex,
    "continue": continue_,
    "cursor": cursor,
    "openai": openai_sdk,
    "anthropic": anthropic_sdk,
    "qwen-code": qwen_code,
}
