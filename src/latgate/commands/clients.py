"""``latgate clients CLIENT``: print the exact settings a coding client needs for this gateway.

Clients (each speaks its own dialect; see docs/clients.md):

==============  ========================================  ================================
client          what is printed (stdout)                  base URL
==============  ========================================  ================================
claude-code     ``~/.claude/settings.json`` (``env``)     without ``/v1`` (it appends
                                                          ``/v1/messages``)
cline           the Cline CLI's ``cline auth`` command     with ``/v1``
                (headers into its providers.json); the
                VS Code panel's fields on stderr
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
import sys
from urllib.parse import urlsplit

from latgate.commands.client_renderers import RENDERERS, ClientSettings
from latgate.foundation.config.errors import ConfigError
from latgate.foundation.config.loader import load_config, resolve_config_path
from latgate.foundation.config.schema import CATCH_ALL, Config
from latgate.foundation.errors import GatewayError
from latgate.routing.decision import Router

KEY_PLACEHOLDER = "<your latgate key>"
#: clients whose settings carry no request headers, by display name: latency marking
#: comes from a latency-sensitive model alias instead
NO_HEADERS = {"cursor": "Cursor", "qwen-code": "Qwen Code"}
NO_AUTH_KEY = "latgate"


class _UsageError(Exception):
    """A bad argument; the message is the whole error line."""


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


def _default_key(config: Config, notes: list[str]) -> str:
    """The key to write when none was given: a placeholder with ``[auth]``, else any."""
    if config.auth is not None and config.auth.keys:
        notes.append("the gateway checks keys ([auth]): pass --key with one of its keys")
        return KEY_PLACEHOLDER
    notes.append("the config has no [auth]: any key is accepted")
    return NO_AUTH_KEY


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
    return ClientSettings(
        origin=origin,
        key=key if key is not None else _default_key(config, notes),
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
