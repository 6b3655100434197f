"""``latgate serve``: run the gateway under uvicorn (uvloop + httptools when installed).

One process by default; ``--workers N`` runs a supervisor and N worker processes on one
socket (:mod:`latgate.process.workers`). Either way SIGTERM drains requests in flight for up to
``--drain-timeout`` seconds and SIGHUP reloads the config (:mod:`latgate.process.lifecycle`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from latgate.foundation.config import Config, ConfigError, load_config, resolve_config_path
from latgate.foundation.config.warnings import per_worker_limits_warning
from latgate.foundation.logs import LOG_FORMATS, configure_logging
from latgate.routing.reach import rule_reach
from latgate.routing.warnings import startup_warnings

DEFAULT_DRAIN_TIMEOUT_SECONDS = 25.0  # inside Kubernetes' default 30 s termination grace period

log = logging.getLogger("latgate")
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="PATH", help="config file (default: $LATGATE_CONFIG, else ./config.toml)"
    )
    parser.add_argument("--host", help="listen address (default: [server] host)")
    parser.add_argument("--port", type=int, help="listen port (default: [server] port)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="default info")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text", help="json: one JSON object per line (default text)")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=DEFAULT_DRAIN_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="on SIGTERM, how long requests in flight may take to finish (default %(default)g)",
    )


def argument_error(args: argparse.Namespace) -> str | None:
    """The problem with ``--port`` (0..65535; 0 is any free port) or ``--workers``
    (at least 1) as one line, or None. Checked before the config is read."""
    port = getattr(args, "port", None)
    if port is not None and not 0 <= port <= 65535:
        return f"--port {port} is not a port number (0..65535)"
    if getattr(args, "workers", 1) < 1:
        return "--workers must be at least 1"
    return None


def pinned_listen_keys(args: argparse.Namespace) -> frozenset[str]:
    """The listen keys the command line set (``"host"`` for ``--host``, ``"port"`` for
    ``--port``), which a reload never asks a restart for (:class:`latgate.app.reload.ListenAddress`)."""
    return frozenset(key for key in ("host", "port") if getattr(args, key) not in (None, ""))


def setup_logging(level: str, log_format: str = "text") -> None:
    """One line per record on stderr, text or JSON (:mod:`latgate.foundation.logs`)."""
    configure_logging(level=level, log_format=log_format)


def describe(config: Config) -> list[str]:
    """The startup lines: which providers, connectors and routes are live, and for each
    rule and fallback the models it applies to (:func:`latgate.routing.reach.rule_reach`)."""
    lines = []
    for name, provider in config.providers.items():
        models = ", ".join(provider.models) or "any model"
        lines.append(
            f"provider {name}: connector={provider.connector} role={provider.role or '-'} "
            f"endpoints={len(provider.endpoints)} models=[{models}] key={'set' if provider.api_key_env and os.environ.get(provider.api_key_env) else 'none'}"
        )
    r = config.routing
    rules = []
    if r.allow_route_override:
        rules.append("X-Route-To")
    if r.long_context_provider and r.long_context_threshold:
        rules.append(f"long_context>{r.long_context_threshold} tokens->{r.long_context_provider}")
    if r.route_latency_sensitive_to:
        rules.append(f"latency_sensitive->{r.route_latency_sensitive_to}")
    if r.policies:
        rules.append("policies=" + ",".join(r.policies))
    rules.append(f"default->{r.default_route}")
    lines.append("routes: " + " | ".join(rules))
    for reach in rule_reach(config):
        label = reach.rule if reach.rule.startswith("fallback ") else f"{reach.rule} -> {reach.provider}"
        lines.append(f"{label}: {reach.summary()}")
    return lines


def startup(
    args: argparse.Namespace, *, simulated: Callable[[Config], set[str]] = lambda config: set()
) -> tuple[Config, Path, str, int] | None:
    """Shared start of ``serve`` and ``demo``: logging, config, warnings (none about the
    keys of the providers ``simulated(config)`` names: simulators need no key).

    Returns ``(config, path, host, port)``, or ``None`` after printing the config error.
    """
    setup_logging(args.log_level, getattr(args, "log_format", "text"))
    try:
        path = resolve_config_path(args.config)
        config = load_config(path)
    except ConfigError as exc:
        for line in exc.lines():  # one prefixed line per mistake, as check/route/clients print
            print(f"latgate: error: {line}", file=sys.stderr)
        return None
    quiet = simulated(config)
    for warning in startup_warnings(config):
        if not any(warning.startswith(f'provider "{name}": api_key_env') for name in quiet):
            log.warning(warning)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    return config, path, host, port


def main(args: argparse.Namespace) -> int:
    problem = argument_error(args)
    if problem is not None:
        print(f"latgate: error: {problem}", file=sys.stderr)
        return 2
    started = startup(args)
    if started is None:
        return 1
    config, path, host, port = started
    if args.drain_timeout < 0:
        print("latgate: error: --drain-timeout must be >= 0 seconds", file=sys.stderr)
        return 2
    for line in describe(config):
        log.info(line)
    limits_warning = per_worker_limits_warning(config, workers=args.workers)
    if limits_warning is not None:
        log.warning(limits_warning)
    return run(
        config,
        host=host,
        port=port,
        workers=args.workers,
        log_level=args.log_level,
        log_format=args.log_format,
        drain_timeout_seconds=args.drain_timeout,
        config_path=str(path),
        pinned=pinned_listen_keys(args),
    )


# long: the serve command's steps in order (descriptors, bind, supervisor or one process, app, serve), each with
# its exit code; the two branches share the socket and the logged address
def run(
    config: Config,
    *,
    host: str,
    port: int,
    workers: int = 1,
    log_level: str = "info",
    log_format: str = "text",
    drain_timeout_seconds: float = DEFAULT_DRAIN_TIMEOUT_SECONDS,
    config_path: str | None = None,
    pinned: frozenset[str] = frozenset(),
) -> int:
    """Serve until SIGTERM/SIGINT (then drain). Exit code 0 on a clean stop, 1 when the
    port is taken (or, with workers, when they crash-loop). ``pinned``: the listen keys
    the command line set (``"host"``, ``"port"``), which a reload never asks a restart
    for (:class:`latgate.app.reload.ListenAddress`)."""
    from latgate.process.listen import ListenError, bind_socket, raise_descriptor_limit, reserve_port

    before, soft, hard = raise_descriptor_limit()
    log.info("file descriptors: soft limit %d (was %d), hard limit %d", soft, before, hard)
    try:
        # workers listen on sockets of their own (SO_REUSEPORT); the supervisor holds the port
        sock = reserve_port(host, port) if workers > 1 else bind_socket(host, port)
    except ListenError as exc:
        print(f"latgate: error: {exc}", file=sys.stderr)
        return 1
    source = config_path or config.source
    port = sock.getsockname()[1]  # the one the kernel chose for --port 0
    if workers > 1:
        from latgate.process.workers import Supervisor

        log.info("listening on http://%s:%d (config %s, %d workers)", host, port, source, workers)
        supervisor = Supervisor(
            sock=sock,
            host=host,
            config_path=source,
            workers=workers,
            log_level=log_level,
            log_format=log_format,
            drain_timeout_seconds=drain_timeout_seconds,
            pinned=pinned,
        )
        return supervisor.run()
    from latgate.app.asgi import create_app
    from latgate.app.reload import ListenAddress
    from latgate.process.lifecycle import serve

    try:
        app = create_app(config)
    except ConfigError as exc:  # found only while building the gateway
        sock.close()
        for line in exc.lines():
            print(f"latgate: error: {line}", file=sys.stderr)
        return 1
    app.state.reloader.listening = ListenAddress(host=host, port=port, pinned=pinned)
    log.info("listening on http://%s:%d (config %s)", host, port, source)
    serve(
        app,
        sock=sock,
        reloader=app.state.reloader,
        log_level=log_level,
        log_format=log_format,
        drain_timeout_seconds=drain_timeout_seconds,
    )
    return 0
