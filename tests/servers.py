"""Real servers on loopback for end-to-end tests.

``serve_app(app)`` runs an ASGI app under uvicorn in a background thread on a free
port and yields its base URL. The listening socket is bound and listening before the
thread starts, so a client may connect at once (the kernel queues it): no sleeps, no
polling for readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

import uvicorn


def listening_socket(host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def serve_app(app, *, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` on a free loopback port; yields ``http://127.0.0.1:PORT``."""
    sock = listening_socket(host)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", loop="asyncio", http="h11")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def serve_like_latgate_serve(app) -> Iterator[int]:
    """Serve ``app`` with the uvicorn settings ``latgate serve`` uses (httptools, the
    client limits of the app's ``[server]``); yields the port."""
    from latgate.process.lifecycle import uvicorn_config

    sock = listening_socket()
    server = uvicorn.Server(
        uvicorn_config(app, log_level="warning", log_format="text", drain_timeout_seconds=1)
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
