"""``latgate demo``: one engine simulator per provider of the config, then the gateway.

A provider gets a simulator when its endpoint is on loopback (``127.0.0.1``,
``localhost``, ``::1``); others (a real upstream reached through an environment
variable) are left alone. The simulators' timing profiles come from each provider's
role, engine and capacity hints (:func:`latgate.sim.profile_for`). Everything runs in
one process on one event loop; Ctrl-C stops all.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from urllib.parse import urlsplit

from latgate.config import ConfigError, config_warnings, load_config, resolve_config_path
from latgate.server import LOG_LEVELS, describe, setup_logging

log = logging.getLogger("latgate")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file (default: $LATGATE_CONFIG, else ./config.toml)")
    parser.add_argument("--host", help="gateway listen address (default: [server] host)")
    parser.add_argument("--port", type=int, help="gateway listen port (default: [server] port)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")


def simulated_endpoints(config) -> list[tuple[str, str, int]]:
    """``(provider, host, port)`` for every loopback endpoint the demo simulates."""
    out = []
    for name, provider in config.providers.items():
        for endpoint in provider.endpoints:
            parts = urlsplit(endpoint.api_base)
            if parts.hostname in LOOPBACK:
                out.append((name, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)))
    return out


def main(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        path = resolve_config_path(args.config)
        config = load_config(path)
    except ConfigError as exc:
        print(f"latgate: error: {exc}", file=sys.stderr)
        return 1
    for warning in config_warnings(config):
        log.warning(warning)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    try:
        asyncio.run(_run(config, host=host, port=port, log_level=args.log_level))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"latgate: error: {exc.strerror or exc} (is another latgate or simulator running?)", file=sys.stderr)
        return 1
    return 0


async def _run(config, *, host: str, port: int, log_level: str) -> None:
    import uvicorn

    from latgate.app import create_app
    from latgate.sim import create_sim_app, profile_for

    uv_level = "warning" if log_level == "info" else log_level
    servers = []
    for name, sim_host, sim_port in simulated_endpoints(config):
        options = profile_for(config.providers[name])
        app = create_sim_app(options)
        servers.append(uvicorn.Server(uvicorn.Config(app, host=sim_host, port=sim_port, log_level=uv_level, access_log=False)))
        log.info("simulator for %s on http://%s:%d", name, sim_host, sim_port)
    for line in describe(config):
        log.info(line)
    gateway = uvicorn.Server(
        uvicorn.Config(create_app(config), host=host, port=port, log_level=uv_level, access_log=False, server_header=False)
    )
    servers.append(gateway)
    log.info("gateway on http://%s:%d/v1 -- try: curl http://%s:%d/v1/models", host, port, host, port)
    await asyncio.gather(*(s.serve() for s in servers))
