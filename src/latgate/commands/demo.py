"""``latgate demo``: one engine simulator per provider of the config, then the gateway.

A provider gets a simulator when its endpoint is on loopback (``127.0.0.1``,
``localhost``, ``::1``); others (a real upstream reached through an environment
variable) are left alone. The simulators' timing profiles come from each provider's
role, engine and capacity hints (:func:`latgate.commands.sim.profile_for`). Everything runs in
one process on one event loop. SIGTERM or Ctrl-C stops the gateway as under ``serve``
(it drains requests in flight, exit status 0), then the simulators; SIGHUP reloads the
gateway's config, the simulators keep running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import uvicorn

from latgate.foundation.config import Config, ConfigError
from latgate.process.listen import ListenError, bind_socket
from latgate.process.server import (
    DEFAULT_DRAIN_TIMEOUT_SECONDS,
    LOG_LEVELS,
    argument_error,
    describe,
    pinned_listen_keys,
    startup,
)

log = logging.getLogger("latgate")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="PATH", help="config file (default: $LATGATE_CONFIG, else ./config.toml)"
    )
    parser.add_argument("--host", help="gateway listen address (default: [server] host)")
    parser.add_argument("--port", type=int, help="gateway listen port (default: [server] port)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")


def simulated_endpoints(config: Config) -> list[tuple[str, str, int]]:
    """``(provider, host, port)`` for every loopback endpoint the demo simulates."""
    out = []
    for name, provider in config.providers.items():
        for endpoint in provider.endpoints:
            parts = urlsplit(endpoint.api_base)
            if parts.hostname in LOOPBACK:
                out.append((name, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)))
    return out


def main(args: argparse.Namespace) -> int:
    problem = argument_error(args)
    if problem is not None:
        print(f"latgate: error: {problem}", file=sys.stderr)
        return 2
    started = startup(args, simulated=lambda config: {name for name, _, _ in simulated_endpoints(config)})
    if started is None:
        return 1
    config, _, host, port = started
    try:
        simulators = [(name, bind_socket(h, p)) for name, h, p in simulated_endpoints(config)]
        gateway_sock = bind_socket(host, port)
    except ListenError as exc:
        print(f"latgate: error: {exc}", file=sys.stderr)
        return 1
    try:
        pinned = pinned_listen_keys(args)
        asyncio.run(
            _run(
                config,
                simulators=simulators,
                gateway_sock=gateway_sock,
                log_level=args.log_level,
                listen_host=host,
                pinned=pinned,
            )
        )
    except KeyboardInterrupt:
        pass
    except ConfigError as exc:  # found only while building the gateway
        for line in exc.lines():
            print(f"latgate: error: {line}", file=sys.stderr)
        return 1
    return 0


class _Simulator(uvicorn.Server):
    """A simulator's server: it installs no signal handlers (the gateway's do) and
    stops when the demo stops it, after the gateway has drained."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _run(
    config: Config,
    *,
    simulators: list[tuple[str, socket.socket]],
    gateway_sock: socket.socket,
    log_level: str,
    listen_host: str,
    pinned: frozenset[str],
) -> None:
    """Serve the simulators (``(provider, socket)``) and the gateway on
    ``gateway_sock`` until SIGTERM or Ctrl-C.
    The gateway stops as under ``serve`` (:class:`~latgate.process.lifecycle.GatewayServer`:
    it drains requests in flight, SIGHUP reloads its config, the exit status is 0);
    the simulators keep answering until it has drained, then stop."""
    from latgate.app.asgi import create_app
    from latgate.app.reload import ListenAddress
    from latgate.commands.sim import create_sim_app, profile_for
    from latgate.process.lifecycle import GatewayServer, uvicorn_config

    uv_level = "warning" if log_level == "info" else log_level
    servers: list[tuple[_Simulator, socket.socket]] = []
    for name, sock in simulators:
        app = create_sim_app(profile_for(config.providers[name]))
        log.info("simulator for %s on http://%s", name, _address(sock))
        options = uvicorn.Config(
            app, log_level=uv_level, access_log=False, server_header=False, proxy_headers=False
        )
        servers.append((_Simulator(options), sock))
    gateway = create_app(config)
    port = gateway_sock.getsockname()[1]  # the one the kernel chose for --port 0
    gateway.state.reloader.listening = ListenAddress(host=listen_host, port=port, pinned=pinned)
    options = uvicorn_config(
        gateway, log_level=log_level, log_format="text", drain_timeout_seconds=DEFAULT_DRAIN_TIMEOUT_SECONDS
    )
    server = GatewayServer(
        options, reloader=gateway.state.reloader, drain_timeout_seconds=DEFAULT_DRAIN_TIMEOUT_SECONDS
    )
    for line in describe(config):
        log.info(line)
    url = f"http://{_address(gateway_sock)}"
    log.info("gateway on %s/v1 -- try: curl %s/v1/models", url, url)
    log.info("live routing page: %s/ui", url)
    running = [asyncio.create_task(sim.serve(sockets=[sock])) for sim, sock in servers]
    try:
        await server.serve(sockets=[gateway_sock])
    finally:
        for sim, _ in servers:
            sim.should_exit = True
        await asyncio.gather(*running, return_exceptions=True)


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
