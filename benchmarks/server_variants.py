"""The HTTP servers latgate could run under, for ``benchmarks/paced_servers.py``:
measurement only, nothing here is served by ``latgate serve``.

    python benchmarks/server_variants.py KIND CONFIG PORT

KIND is one of:

- ``uvicorn``: what ``latgate serve`` runs (uvloop, httptools, latgate's client limits);
- ``granian-asgi``: granian (Rust, hyper) calling the same ASGI app, one worker, one
  runtime thread, uvloop;
- ``granian-rsgi``: granian's own RSGI interface, with the hot routes' ASGI messages
  mapped onto RSGI's ``response_stream`` / ``send_bytes`` by a thin adapter;
- ``own``: a bare asyncio ``Protocol`` (httptools parser) that calls the ASGI app with
  a ``send`` that writes straight to the transport: the least a server of latgate's own
  could cost per event. It keeps connections alive and parses content-length and
  chunked bodies, and nothing else (no limits, timeouts or drain): a lower bound for
  the measurement, not a server to ship.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

CONFIG_ENV = "LATGATE_BENCH_CONFIG"


def _app():
    from latgate.app.asgi import create_app
    from latgate.foundation.config import load_config
    from latgate.process.gcpolicy import settle_heap
    from latgate.process.server import setup_logging

    setup_logging("info")  # access lines at INFO, as `latgate serve` writes them
    app = create_app(load_config(Path(os.environ[CONFIG_ENV])))
    settle_heap()  # the collector as `latgate serve` sets it up
    return app


def granian_asgi_app():
    """Factory for granian's ASGI interface."""
    return _app()


class _Lifespan:
    """Runs an ASGI app's lifespan startup once, on the serving loop."""

    def __init__(self, app) -> None:
        self.app = app
        self._started: asyncio.Future | None = None

    async def ensure(self) -> None:
        if self._started is None:
            loop = asyncio.get_running_loop()
            self._started = loop.create_future()
            messages: asyncio.Queue = asyncio.Queue()
            await messages.put({"type": "lifespan.startup"})

            async def send(message: dict) -> None:
                if message["type"].startswith("lifespan.startup") and not self._started.done():
                    self._started.set_result(None)

            loop.create_task(self.app({"type": "lifespan", "asgi": {"version": "3.0"}}, messages.get, send))
        await self._started


class RSGIAdapter:
    """An ASGI app behind granian's RSGI interface (HTTP only)."""

    def __init__(self, app) -> None:
        self.lifespan = _Lifespan(app)
        self.app = app

    async def __rsgi__(self, scope, protocol) -> None:
        await self.lifespan.ensure()
        host, _, port = (scope.client or "127.0.0.1:0").rpartition(":")
        asgi_scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": scope.method,
            "scheme": scope.scheme,
            "path": scope.path,
            "raw_path": scope.path.encode(),
            "query_string": scope.query_string.encode(),
            "root_path": "",
            "headers": [(k.encode().lower(), v.encode()) for k, v in scope.headers.items()],
            "client": (host, int(port or 0)),
            "server": ("127.0.0.1", 0),
        }
        state = {"body_read": False, "status": 200, "headers": [], "stream": None}

        async def receive() -> dict:
            if not state["body_read"]:
                state["body_read"] = True
                return {"type": "http.request", "body": await protocol(), "more_body": False}
            await protocol.client_disconnect()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                state["status"] = message["status"]
                state["headers"] = [(k.decode(), v.decode()) for k, v in message.get("headers", [])]
            elif kind == "http.response.body":
                body = message.get("body", b"")
                stream = state["stream"]
                if stream is None:
                    if not message.get("more_body", False):
                        protocol.response_bytes(state["status"], state["headers"], body)
                        return
                    stream = state["stream"] = protocol.response_stream(state["status"], state["headers"])
                if body:
                    await stream.send_bytes(body)

        await self.app(asgi_scope, receive, send)


def granian_rsgi_app():
    """Factory for granian's RSGI interface."""
    return RSGIAdapter(_app())


def serve_granian(interface: str, port: int) -> None:
    from granian import Granian
    from granian.constants import Interfaces, Loops

    target = "server_variants:granian_asgi_app" if interface == "asgi" else "server_variants:granian_rsgi_app"
    Granian(
        target,
        address="127.0.0.1",
        port=port,
        interface=Interfaces.ASGI if interface == "asgi" else Interfaces.RSGI,
        workers=1,
        runtime_threads=1,
        loop=Loops.uvloop,
        factory=True,
        backlog=2048,
        log_access=False,
        working_dir=Path(__file__).resolve().parent,
    ).serve()


class OwnProtocol(asyncio.Protocol):
    """The bare per-connection protocol of ``own`` (module docstring)."""

    app = None

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpRequestParser(self)
        self.transport = None
        self.headers: list = []
        self.url = b""
        self.body: list[bytes] = []
        self.paused: asyncio.Future | None = None
        self.closed = False
        self.gone: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.gone is not None and not self.gone.done():
            self.gone.set_result(None)
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def pause_writing(self) -> None:
        self.paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)
        self.paused = None

    def on_message_begin(self) -> None:
        self.headers, self.url, self.body = [], b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path, _, query = self.url.partition(b"?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": self.parser.get_method().decode(),
            "scheme": "http",
            "path": path.decode(),
            "raw_path": path,
            "query_string": query,
            "root_path": "",
            "headers": self.headers,
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }
        asyncio.get_running_loop().create_task(self.cycle(scope, b"".join(self.body)))

    async def cycle(self, scope: dict, body: bytes) -> None:
        transport = self.transport
        state = {"read": False, "chunked": False, "head": b""}

        async def receive() -> dict:
            if not state["read"]:
                state["read"] = True
                return {"type": "http.request", "body": body, "more_body": False}
            if not self.closed:
                self.gone = asyncio.get_running_loop().create_future()
                await self.gone
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                lines = [b"HTTP/1.1 %d OK\r\n" % message["status"]]
                has_length = False
                for name, value in message.get("headers", []):
                    has_length = has_length or name.lower() == b"content-length"
                    lines.append(name + b": " + value + b"\r\n")
                if not has_length:
                    lines.append(b"transfer-encoding: chunked\r\n")
                    state["chunked"] = True
                state["head"] = b"".join(lines) + b"\r\n"
                return
            if kind != "http.response.body":
                return
            data = message.get("body", b"")
            more = message.get("more_body", False)
            out = state["head"]
            state["head"] = b""
            if state["chunked"]:
                if data:
                    out += b"%x\r\n%b\r\n" % (len(data), data)
                if not more:
                    out += b"0\r\n\r\n"
            else:
                out += data
            if out and not self.closed:
                transport.write(out)
            if self.paused is not None:
                await self.paused

        await self.app(scope, receive, send)


def serve_own(port: int) -> None:
    import uvloop

    async def main() -> None:
        app = _app()
        await _Lifespan(app).ensure()
        OwnProtocol.app = app
        server = await asyncio.get_running_loop().create_server(OwnProtocol, "127.0.0.1", port, backlog=2048)
        await server.serve_forever()

    uvloop.run(main())


def serve_uvicorn(port: int) -> None:
    from latgate.process.lifecycle import serve
    from latgate.process.listen import bind_socket

    app = _app()
    serve(app, sock=bind_socket("127.0.0.1", port), reloader=None, log_level="warning", log_format="text", drain_timeout_seconds=1.0)


def main() -> int:
    kind, config, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ[CONFIG_ENV] = config
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if kind == "uvicorn":
        serve_uvicorn(port)
    elif kind in ("granian-asgi", "granian-rsgi"):
        serve_granian(kind.split("-")[1], port)
    elif kind == "own":
        serve_own(port)
    else:
        print(f"unknown server {kind!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
