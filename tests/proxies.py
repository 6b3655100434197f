"""A small HTTP proxy on loopback for the tests of latgate's proxy support: ``CONNECT``
tunnels (https upstreams) and absolute-form requests (http ones), optional Basic
credentials (407 without them). Runs on its own thread; ``seen`` keeps each request's
first line and its ``Proxy-Authorization`` value."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from collections.abc import Iterator
from typing import Self
from urllib.parse import urlsplit


class ConnectProxy:
    """``with ConnectProxy(user="u", password="p") as proxy: proxy.url``."""

    def __init__(self, *, user: str | None = None, password: str | None = None) -> None:
        self.expected = None if user is None else "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.seen: list[tuple[str, str | None]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._credentials = f"{user}:{password}@" if user is not None else ""

    @property
    def url(self) -> str:
        return f"http://{self._credentials}127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._relay(reader, writer)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            auth = next((v for k, v in fields.items() if k.lower() == "proxy-authorization"), None)
            self.seen.append((lines[0], auth))
            if self.expected is not None and auth != self.expected:
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                writer.close()
                return
            method, target, _ = lines[0].split(" ", 2)
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await writer.drain()
                await _pipe_both(reader, writer, up_reader, up_writer)
                return
            parts = urlsplit(target)  # absolute form: forward in origin form
            up_reader, up_writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            origin = parts.path + (f"?{parts.query}" if parts.query else "")
            kept = [line for line in lines[1:] if line and not line.lower().startswith("proxy-authorization")]
            up_writer.write(f"{method} {origin} HTTP/1.1\r\n".encode() + "\r\n".join(kept).encode() + b"\r\n\r\n")
            await _pipe_both(reader, writer, up_reader, up_writer)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def _pipe_both(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter
) -> None:
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


@contextlib.contextmanager
def connect_proxy(**credentials: str) -> Iterator[ConnectProxy]:
    with ConnectProxy(**credentials) as proxy:
        yield proxy
