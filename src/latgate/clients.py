"""``latgate clients CLIENT``: print the exact settings a coding client needs for this gateway.

Clients (each speaks its own dialect; see docs/clients.md):

==============  ========================================  ================================
client          what is printed (stdout)                  base URL
==============  ========================================  ================================
claude-code     ``~/.claude/settings.json`` (``env``)     without ``/v1`` (it appends
                                                          ``/v1/messages``)
cline           VS Code settings JSON                     with ``/v1``
codex           ``~/.codex/config.toml`` (Responses API)   with ``/v1``
continue        a ``config.yaml`` ``models:`` list         with ``/v1``
cursor          the values for Settings > Models          with ``/v1``; public HTTPS only
openai          shell exports for the openai SDKs         with ``/v1``
anthropic       a Python program for the anthropic SDK    without ``/v1``
qwen-code       shell exports Qwen Code reads             with ``/v1``
==============  ========================================  ================================

Latency marking: ``--latency-sensitive`` adds ``X-Latency-Sensitive: 1`` and
``--policy NAME`` adds ``X-Route-Policy: NAME`` for clients that can send headers;
Cursor and Qwen Code (from these settings) cannot, so they are given a model alias marked ``latency_sensitive`` in
``[models."NAME"]`` instead (a key's ``policy`` in ``[[auth.keys]]`` also works).
Advice that is not part of the settings (where to put them, known limits) goes to
stderr as ``latgate: note: ...`` lines, so stdout can be redirected into a file.
Exit codes: 0 printed; 1 a bad config, model, policy or URL (one ``latgate: error:``
line).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from latgate.config.errors import ConfigError
from latgate.config.loader import load_config, resolve_config_path
from latgate.config.schema import CATCH_ALL, Config
from latgate.errors import GatewayError
from latgate.routing.decision import Router

KEY_PLACEHOLDER = "<your latgate key>"
#: clients whose settings carry no request headers, by display name: latency marking
#: comes from a latency-sensitive model alias instead
NO_HEADERS = {"cursor": "Cursor", "qwen-code": "Qwen Code"}
NO_AUTH_KEY = "latgate"


class _UsageError(Exception):
    """A bad argument; the message is the whole error line."""


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``latgate clients``."""
    parser.add_argument(
        "client", choices=sorted(RENDERERS), metavar="CLIENT", help=", ".join(sorted(RENDERERS))
    )
    parser.add_argument(
        "--config", metavar="PATH", help="config file (default: $LATGATE_CONFIG, else ./config.toml)"
    )
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="the gateway's URL as the client reaches it (default: [server] host and port of the config)",
    )
    parser.add_argument(
        "--key", metavar="KEY", help="the gateway key the client presents (default: a placeholder)"
    )
    parser.add_argument(
        "--model",
        metavar="NAME",
        help="model to ask for (default: routing.default_model, else the first model)",
    )
    parser.add_argument("--policy", metavar="NAME", help="route policy sent as X-Route-Policy: NAME")
    parser.add_argument(
        "--latency-sensitive",
        action="store_true",
        help="mark every request latency-sensitive (a header, or for Cursor and Qwen Code a latency-sensitive model alias)",
    )


def main(args: argparse.Namespace) -> int:
    """Print ``args.client``'s settings; return the exit code."""
    notes: list[str] = []
    try:
        config = load_config(resolve_config_path(args.config))
        settings = settings_for(
            config,
            client=args.client,
            base_url=args.base_url,
            key=args.key,
            model=args.model,
            policy=args.policy,
            latency_sensitive=args.latency_sensitive,
            notes=notes,
        )
    except (ConfigError, _UsageError) as exc:
        for line in str(exc).splitlines():
            print(f"latgate: error: {line}", file=sys.stderr)
        return 1
    text, client_notes = RENDERERS[args.client](settings)
    print(text)
    for note in notes + client_notes:
        print(f"latgate: note: {note}", file=sys.stderr)
    return 0


def settings_for(
    config: Config,
    *,
    client: str,
    base_url: str | None,
    key: str | None,
    model: str | None,
    policy: str | None,
    latency_sensitive: bool,
    notes: list[str],
) -> ClientSettings:
    """The settings for ``client`` against a gateway running ``config``.

    Raises:
        _UsageError: a malformed ``base_url``; a ``model`` no provider serves; a
            ``policy`` not in ``[routing.policies]``; Cursor asked for a header
            (``policy``) or for latency marking without a latency-sensitive alias.
    """
    origin = _origin(base_url) if base_url else _config_origin(config)
    fast = next((name for name, m in config.models.items() if m.latency_sensitive), None)
    headers: dict[str, str] = {}
    if policy is not None:
        if policy not in config.routing.policies:
            known = ", ".join(config.routing.policies) or "none"
            raise _UsageError(f"--policy {policy!r} is not in [routing.policies] (known: {known})")
        if client in NO_HEADERS:
            raise _UsageError(
                f"{NO_HEADERS[client]} cannot send X-Route-Policy; give its key a policy in [[auth.keys]] "
                "or use --latency-sensitive"
            )
        headers["X-Route-Policy"] = policy
    if latency_sensitive and client in NO_HEADERS:
        if fast is None:
            raise _UsageError(
                f"{NO_HEADERS[client]} cannot send headers: mark a model alias latency-sensitive in the config "
                '([models."NAME-highspeed"] latency_sensitive = true) and pass it with --model'
            )
        model = model or fast
    elif latency_sensitive:
        headers["X-Latency-Sensitive"] = "1"
    chosen = model or config.routing.default_model or _client_name(config, next(iter(config.public_models()), None))
    if chosen is None:
        raise _UsageError(
            "the config names no model (routing.default_model or a provider's models); pass --model NAME"
        )
    _check_served(config, chosen)
    if key is None:
        if config.auth is not None and config.auth.keys:
            key = KEY_PLACEHOLDER
            notes.append("the gateway checks keys ([auth]): pass --key with one of its keys")
        else:
            key = NO_AUTH_KEY
            notes.append("the config has no [auth]: any key is accepted")
    return ClientSettings(
        origin=origin,
        key=key,
        model=chosen,
        fast_model=fast or chosen,
        headers=headers,
        timeout_ms=int(upstream_timeout_seconds(config) * 1000),
    )


def _client_name(config: Config, model: str | None) -> str | None:
    """The name clients are meant to ask for: the first ``[aliases]`` name that maps to
    ``model`` (an upstream's name) and is not a latency-sensitive alias, else ``model``."""
    if model is None or model in config.aliases:
        return model
    for public, served in config.aliases.items():
        marked = config.models.get(public)
        if public != CATCH_ALL and model in served.values() and not (marked and marked.latency_sensitive):
            return public
    return model


def upstream_timeout_seconds(config: Config) -> float:
    """The longest silence latgate waits for between two upstream reads, in seconds: the
    largest of ``[defaults] timeout_sec`` and every provider's own ``timeout_sec``
    (a client waiting that long never gives up before the gateway does)."""
    return max([config.defaults.timeout_sec, *(p.timeout_sec for p in config.providers.values() if p.timeout_sec)])


def _check_served(config: Config, model: str) -> None:
    try:
        Router(config).decide({"model": model, "messages": []}, {})
    except GatewayError as exc:
        raise _UsageError(f"--model: {exc.message}") from None


def _origin(base_url: str) -> str:
    """``base_url`` without a trailing ``/`` or ``/v1``.

    Raises:
        _UsageError: not an ``http://`` or ``https://`` URL with a host.
    """
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _UsageError(f"--base-url {base_url!r} is not an http(s) URL such as https://gw.example.com")
    origin = base_url.strip().rstrip("/")
    return origin.removesuffix("/v1")


def _config_origin(config: Config) -> str:
    host = config.server.host
    if host in ("", "0.0.0.0", "::"):  # listening everywhere: reachable on loopback at least
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{config.server.port}"


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


def cline(s: ClientSettings) -> tuple[str, list[str]]:
    settings: dict[str, object] = {
        "cline.apiProvider": "openai",
        "cline.openai.baseUrl": s.v1,
        "cline.openai.apiKey": s.key,
        "cline.openai.model": s.model,
        "cline.openai.timeout": s.timeout_ms,
    }
    if s.headers:
        settings["cline.customHeaders"] = s.headers
    notes = [
        'in the Cline panel: API Provider "OpenAI Compatible", the same base URL, key, model ID and custom headers'
    ]
    return json.dumps(settings, indent=2), notes


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


def openai_sdk(s: ClientSettings) -> tuple[str, list[str]]:
    lines = [f"export OPENAI_BASE_URL={shlex.quote(s.v1)}", f"export OPENAI_API_KEY={shlex.quote(s.key)}"]
    arguments = f"default_headers={json.dumps(s.headers)}" if s.headers else ""
    message = json.dumps([{"role": "user", "content": "hello"}])
    lines += [
        "# Python (base URL and key from the environment):",
        "#   from openai import OpenAI",
        f"#   client = OpenAI({arguments})",
        f"#   reply = client.chat.completions.create(model={json.dumps(s.model)}, messages={message})",
        "#   print(reply.choices[0].message.content)",
    ]
    return "\n".join(lines), []


def anthropic_sdk(s: ClientSettings) -> tuple[str, list[str]]:
    """A Python program for the anthropic SDK; its ``base_url`` is the origin without
    ``/v1`` (the SDK appends ``/v1/messages``; anthropic-sdk-python ``Anthropic``)."""
    arguments = [f"base_url={json.dumps(s.origin)}", f"api_key={json.dumps(s.key)}"]
    if s.headers:
        arguments.append(f"default_headers={json.dumps(s.headers)}")
    message = json.dumps([{"role": "user", "content": "hello"}])
    lines = [
        "from anthropic import Anthropic",
        "",
        f"client = Anthropic({', '.join(arguments)}, timeout={s.timeout_ms / 1000:g})",
        f"reply = client.messages.create(model={json.dumps(s.model)}, max_tokens=256, messages={message})",
        "print(reply.content[0].text)",
    ]
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
