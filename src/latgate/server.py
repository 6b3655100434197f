"""``latgate serve``: run the gateway under uvicorn (uvloop + httptools when installed)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from latgate.config import ConfigError, config_warnings, load_config, resolve_config_path

log = logging.getLogger("latgate")
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file (default: $LATGATE_CONFIG, else ./config.toml)")
    parser.add_argument("--host", help="listen address (default: [server] host)")
    parser.add_argument("--port", type=int, help="listen port (default: [server] port)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="default info")


def setup_logging(level: str) -> None:
    """Plain one-line records on stderr; access lines are JSON objects already."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    # httpx logs every request with its full URL at INFO: internal addresses stay out of logs.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def describe(config) -> list[str]:
    """The startup lines: which providers, connectors and routes are live."""
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
    return lines


def app_factory():
    """uvicorn factory for ``--workers N``: each worker loads ``$LATGATE_CONFIG``."""
    from latgate.app import create_app

    return create_app(load_config(os.environ["LATGATE_CONFIG"]))


def startup(args: argparse.Namespace, *, simulated=lambda config: set()):
    """Shared start of ``serve`` and ``demo``: logging, config, warnings (none about the
    keys of the providers ``simulated(config)`` names: simulators need no key).

    Returns ``(config, path, host, port)``, or ``None`` after printing the config error.
    """
    setup_logging(args.log_level)
    try:
        path = resolve_config_path(args.config)
        config = load_config(path)
    except ConfigError as exc:
        print(f"latgate: error: {exc}", file=sys.stderr)
        return None
    quiet = simulated(config)
    for warning in config_warnings(config):
        if not any(warning.startswith(f'provider "{name}": api_key_env') for name in quiet):
            log.warning(warning)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    return config, path, host, port


def main(args: argparse.Namespace) -> int:
    started = startup(args)
    if started is None:
        return 1
    config, path, host, port = started
    if args.workers < 1:
        print("latgate: error: --workers must be at least 1", file=sys.stderr)
        return 2
    for line in describe(config):
        log.info(line)
    return run(config, host=host, port=port, workers=args.workers, log_level=args.log_level, config_path=str(path))


def run(config, *, host: str, port: int, workers: int = 1, log_level: str = "info", config_path: str | None = None) -> int:
    """Serve until interrupted. Exit code 0 on a clean stop, 1 when the port is taken."""
    import uvicorn

    options = dict(
        host=host,
        port=port,
        log_level="warning" if log_level == "info" else log_level,
        access_log=False,
        loop="auto",
        http="auto",
        timeout_keep_alive=75,
        server_header=False,
        proxy_headers=False,  # latgate reads no client address; skips a middleware per request
    )
    if workers > 1 and config_path:
        log.info("listening on http://%s:%d (config %s, %d workers)", host, port, config_path, workers)
        os.environ["LATGATE_CONFIG"] = os.path.abspath(config_path)
        uvicorn.run("latgate.server:app_factory", factory=True, workers=workers, **options)
        return 0
    from latgate.app import create_app
    from latgate.listen import ListenError, bind_socket

    try:
        sock = bind_socket(host, port)
    except ListenError as exc:
        print(f"latgate: error: {exc}", file=sys.stderr)
        return 1
    server = uvicorn.Server(uvicorn.Config(create_app(config), **options))
    log.info("listening on http://%s:%d (config %s)", host, port, config_path or config.source)
    server.run(sockets=[sock])
    return 0
