"""``latgate demo``: one engine simulator per provider of the config, then the gateway.

A provider gets a simulator when its endpoint is on loopback (``127.0.0.1``,
``localhost``, ``::1``); others (a real upstream reached through an environment
variable) are left alone. The simulators' timing profiles come from each provider's
role, engine and capacity hints (:func:`latgate.sim.profile_for`). Everything runs in
one process on one event loop; Ctrl-C stops all; SIGHUP reloads the gateway's config
(as under ``serve``), the simulators keep running.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from urllib.parse import urlsplit

from latgate.config import Config, ConfigError
from latgate.listen import ListenError, bind_socket
from latgate.server import LOG_LEVELS, argument_error, describe, pinned_listen_keys, startup
from latgate.starts import ASGIApp

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


async def _run(
    config: Config,
    *,
    simulators: list[tuple[str, socket.socket]],
    gateway_sock: socket.socket,
    log_level: str,
    listen_host: str,
    pinned: frozenset[str],
) -> None:
    import uvicorn

    from latgate.app import create_app
    from latgate.lifecycle import reload_on_sighup
    from latgate.reload import ListenAddress
    from latgate.sim import create_sim_app, profile_for

    uv_level = "warning" if log_level == "info" else log_level

    def server(app: ASGIApp) -> uvicorn.Server:
        return uvicorn.Server(
            uvicorn.Config(app, log_level=uv_level, access_log=False, server_header=False, proxy_headers=False)
        )

    servers = []
    for name, sock in simulators:
        servers.append((server(create_sim_app(profile_for(config.providers[name]))), sock))
        log.info("simulator for %s on http://%s", name, _address(sock))
    gateway = create_app(config)
    port = gateway_sock.getsockname()[1]  # the one the kernel chose for --port 0
    gateway.state.reloader.listening = ListenAddress(host=listen_host, port=port, pinned=pinned)
    servers.append((server(gateway), gateway_sock))
    for line in describe(config):
        log.info(line)
    url = f"http://{_address(gateway_sock)}"
    log.info("gateway on %s/v1 -- try: curl %s/v1/models", url, url)
    log.info("live routing page: %s/ui", url)
    # Each server installs its signal handler over the previous one and, on exit, hands
    # the captured signal back down the chain: one Ctrl-C stops them all. uvicorn leaves
    # SIGHUP alone (its default would end the process): it reloads the gateway's config
    # as under ``serve``; the simulators keep running.
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload_on_sighup, gateway.state.reloader)
    await asyncio.gather(*(server.serve(sockets=[sock]) for server, sock in servers))


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
