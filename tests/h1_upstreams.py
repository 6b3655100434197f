"""Hostile and buggy HTTP/1.1 upstreams on loopback, for the tests of latgate's own
upstream pool (:mod:`latgate.transport.h1`): raw bytes on the wire, no framework framing.

- :func:`serving` runs a handler on the calling test's event loop (direct pool tests:
  :func:`new_pool`, :func:`fetch`, :func:`answering`).
- :class:`RawUpstream` runs one on a thread of its own, for a gateway in front of it
  (:func:`stack_on`); it counts open connections and requests and lets the test thread
  wait for a state with :meth:`RawUpstream.wait_until` instead of sleeping.
- :func:`assert_clean_logs`: no traceback, provider key or upstream address logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Self

import httpx
import pytest
from stack import gateway, requests_total

from latgate.transport.h1 import H1Pool

SECRET = "sk-h1-faults-secret-7c1d"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**CHAT, "stream": True}
OK_JSON = b'{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'




def chunk(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def json_reply(body: bytes = OK_JSON, *, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status,
        len(body),
        extra,
        body,
    )


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,  # a GET (health probe) has no body
    )
    return head + await reader.readexactly(length)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0)."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# --- a raw upstream on its own thread (end-to-end tests) ------------------------------------

Handler = Callable[["RawUpstream", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawUpstream:
    """A loopback HTTP/1.1 server speaking raw bytes, on its own event loop thread
    (``tls``: a server context, for an https upstream).

    ``handler(upstream, reader, writer)`` serves one connection. Counts connections
    (``total``, ``open``) and requests; ``wait_until(predicate)`` blocks the test thread
    until a predicate over those holds (no sleeps); ``release()`` sets ``released`` (an
    ``asyncio.Event`` on the server's loop) for handlers that stall.
    """

    def __init__(self, handler: Handler, *, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self._tls = tls
        self.total = 0
        self.open = 0
        self.requests: list[bytes] = []
        self._changed = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self.released = asyncio.Event()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        self.base_url = f"{'https' if tls else 'http'}://{shown}:{self.port}/v1"
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()

    def __enter__(self) -> Self:
        self._thread.start()
        self._started.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._done = asyncio.Event()
        self.released = asyncio.Event()
        server = await asyncio.start_server(self._serve, sock=self._sock, ssl=self._tls)
        self._started.set()
        await self._done.wait()
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _stop(self) -> None:
        self._done.set()

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self.released.set)

    def _bump(self, **deltas: int) -> None:
        with self._changed:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)
            self._changed.notify_all()

    def note_request(self, request: bytes) -> None:
        with self._changed:
            self.requests.append(request)
            self._changed.notify_all()

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        with self._changed:
            assert self._changed.wait_for(predicate, timeout), "upstream never reached the expected state"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._bump(total=1, open=1)
        try:
            await self.handler(self, reader, writer)
            # the handler is done writing: the connection stays until the client closes it
            while await reader.read(65536):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)
            self._bump(open=-1)

    def posts(self) -> list[bytes]:
        """The POSTs (completions) received: not the gateway's health or readiness GETs."""
        with self._changed:
            return [request for request in self.requests if request.startswith(b"POST ")]

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        request = await read_request(reader)
        self.note_request(request)
        return request


def keep_serving(reply: bytes | Callable[[int], bytes]) -> Handler:
    """A keep-alive handler answering every request on the connection with ``reply``."""

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await up.request(reader)
            writer.write(reply(len(up.requests)) if callable(reply) else reply)
            await writer.drain()

    return handler


def config(base: str, *, retries: int = 0, ftt: float = 10, timeout: float = 10, extra: str = "") -> str:
    return (
        f"[defaults]\ntimeout_sec = {timeout}\nconnect_timeout_sec = 2\nfirst_token_timeout_sec = {ftt}\n"
        f'max_retries = {retries}\n[providers.up]\napi_base = "{base}"\napi_key_env = "UP_KEY"\n{extra}'
    )


def fallback_config(first: str, second: str, *, ftt: float = 20, timeout: float = 30, extra: str = "") -> str:
    """Provider ``up`` at ``first`` (the default route, keyed), failing over to ``spare``
    at ``second``; no retries on the same provider, ``timeout_sec`` ``timeout``."""
    return (
        f"[defaults]\ntimeout_sec = {timeout}\nconnect_timeout_sec = 2\nfirst_token_timeout_sec = {ftt}\nmax_retries = 0\n"
        f'{extra}[providers.up]\napi_base = "{first}"\napi_key_env = "UP_KEY"\n'
        f'[providers.spare]\napi_base = "{second}"\n'
        '[routing]\ndefault_route = "up"\nfallbacks = { up = ["spare"] }\n'
    )


@contextlib.contextmanager
def stack_on(handler: Handler, **options: float) -> Iterator[tuple[RawUpstream, str, object]]:
    """A raw upstream and a gateway in front of it: (upstream, gateway /v1 URL, app)."""
    with RawUpstream(handler) as up, gateway(config(up.base_url, **options), env={"UP_KEY": SECRET}) as gw:
        yield up, gw.v1, gw.app


def gauge_total(base_v1: str, name: str) -> float:
    """The sum of the gateway's gauge ``name`` over its labels, read from ``/metrics``."""
    text = httpx.get(base_v1.removesuffix("/v1") + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def in_flight(base_v1: str) -> float:
    """Requests the gateway is serving (``latgate_in_flight_requests``)."""
    return gauge_total(base_v1, "latgate_in_flight_requests")


def pool_in_use(base_v1: str) -> float:
    """Upstream connections busy in the gateway's pool (``latgate_upstream_pool_in_use``)."""
    return gauge_total(base_v1, "latgate_upstream_pool_in_use")


def requests_with(port: int, code: int) -> float:
    """``latgate_requests_total`` of the gateway on ``port`` for status ``code``, summed
    over providers and models."""
    return requests_total(f"http://127.0.0.1:{port}", code)


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    """The access lines logged so far (``latgate.access`` at INFO must be captured)."""
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access"]


def access_errors(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """``(status, error)`` of each access line logged so far."""
    return [(line["status"], line["error"]) for line in access_lines(caplog)]


def assert_clean_logs(caplog: pytest.LogCaptureFixture) -> None:
    """No latgate or uvicorn log line carries a traceback, the provider key or an
    upstream address."""
    for record in caplog.records:
        if not record.name.startswith(("latgate", "uvicorn")):
            continue
        text = record.getMessage()
        assert record.exc_info is None, f"traceback logged by {record.name}: {text}"
        assert "Traceback" not in text and SECRET not in text, text
        if record.name.startswith("latgate"):
            assert "127.0.0.1:" not in text and "[::1]" not in text, text


# --- direct: the pool against a server on the test's own loop -------------------------------


def new_pool(max_connections: int = 10) -> H1Pool:
    return H1Pool(connect_timeout_seconds=2.0, ssl_context=None, max_connections=max_connections)


@contextlib.asynccontextmanager
async def serving(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    *,
    host: str = "127.0.0.1",
    path: str = "/v1/chat/completions",
):
    """A server on this loop; yields (url, state) where state counts connections and
    keeps the raw requests."""
    state = {"connections": 0, "open": 0, "requests": []}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state["connections"] += 1
        state["open"] += 1
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            state["open"] -= 1
            writer.close()

    server = await asyncio.start_server(serve, host, 0)
    port = server.sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    try:
        yield f"http://{shown}:{port}{path}", state
    finally:
        server.close()


async def fetch(
    pool: H1Pool, url: str, *, payload: bytes = b"{}", read_timeout: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    response = await pool.post(url=url, payload=payload, headers={}, read_timeout_seconds=read_timeout)
    try:
        return response.status_code, dict(response.headers), await response.aread()
    finally:
        await response.aclose()


def answering(*replies: bytes, pause_after_first_write: bool = False, record: list[bytes] | None = None):
    """A keep-alive handler: the n-th request (across connections) gets ``replies[n]`` (the
    last one repeats). ``pause_after_first_write``: each reply is written in two parts, the
    first part's end marked by ``|``, with a short pause between (pacing an interim
    response ahead of the final one, so the client parses it on its own)."""

    count = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        while True:
            request = await read_request(reader)
            if record is not None:
                record.append(request)
            reply = replies[min(count, len(replies) - 1)]
            count += 1
            if pause_after_first_write and b"|" in reply:
                first, rest = reply.split(b"|", 1)
                writer.write(first)
                await writer.drain()
                await asyncio.sleep(0.05)
                reply = rest
            writer.write(reply)
            await writer.drain()

    return handler


OK_SMALL = json_reply(b'{"ok":1}')
