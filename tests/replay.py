"""A replay upstream: scripted HTTP/1.1 responses written byte-exactly on loopback.

The stream relay must survive what real upstreams put on the wire: odd SSE line
endings, comments, events split across reads, bodies that stop without their last chunk,
upstreams that go quiet. uvicorn frames responses itself, so this server speaks HTTP/1.1
directly over asyncio streams (RFC 9112: message framing by ``Content-Length``, by
``Transfer-Encoding: chunked``, or by connection close) and writes each body piece with
its own ``write()`` + ``drain()``.

::

    body = load_stream("vllm_chat")
    script = ReplayScript.sse(body, split_at=split_points(body, "events"), pause_ms=1)
    with replay_server([ReplayScript.json_response(503, {...}), script]) as server:
        httpx.post(server.base_url + "/chat/completions", json={...})
        assert len(server.requests) == 2

The listening socket is bound before the server thread starts, so clients may connect at
once. ``server.client_closed`` is set when the peer closes the connection before the
response was fully written (while stalling, pausing or writing), so a test can wait for
"the gateway closed the upstream connection" with ``Event.wait(timeout)``, not a sleep.
Recorded SSE bodies live in ``tests/fixtures/streams/`` (see its README).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http
import itertools
import json
import random
import socket
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

Framing = Literal["chunked", "content-length", "close"]
End = Literal["complete", "drop", "reset", "stall"]
SplitHow = Literal["bytes", "utf8", "crlf", "events", "random"]

STREAMS_DIR = Path(__file__).parent / "fixtures" / "streams"
_MAX_LINE_BYTES = 64 * 1024
_SCRIPT_EXHAUSTED = {"error": {"message": "replay script exhausted", "type": "api_error", "code": None}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayScript:
    """One scripted response.

    Parameters:
        status: HTTP status code; the reason phrase is the standard one.
        headers: response headers as ``(name, value)`` pairs, written in order. Framing
            headers (``Content-Length``, ``Transfer-Encoding``) come from ``framing``.
        body_pieces: the body, each piece written by its own ``write()`` + ``drain()``
            (one HTTP chunk per piece under ``chunked`` framing).
        framing: ``"chunked"`` (as vLLM/uvicorn stream SSE), ``"content-length"``, or
            ``"close"`` (no length; the body ends when the server closes the connection).
        end: ``"complete"``; ``"drop"`` (close with FIN after the pieces: no terminating
            chunk, or fewer bytes than the declared length); ``"reset"`` (close with RST;
            bytes still in flight may be lost by the client); ``"stall"`` (after the
            pieces write nothing until the client closes or ``server.release`` is set,
            then end as ``"complete"``).
        pause_ms: pause between pieces, in milliseconds, so they tend to arrive as
            separate reads (TCP_NODELAY is on).
        stall_before_headers: read the request, then write nothing until the client
            closes or ``server.release`` is set (an upstream that never answers).
        hold_after_pieces: after writing this many body pieces, write nothing until
            the client closes or ``server.resume`` is set, then go on (an upstream
            that sent a keep-alive comment and thinks).
        content_length: the declared ``Content-Length`` (``content-length`` framing
            only). Default: the pieces' total, plus one when ``end`` is ``"drop"``,
            ``"reset"`` or ``"stall"``, so the client really is still waiting for bytes.
            After a released stall a body shorter than declared ends by closing.

    Raises:
        ValueError: inconsistent fields (an empty piece under chunked framing, which
            would end the body; a framing header in ``headers``; unknown framing).
    """

    status: int = 200
    headers: Sequence[tuple[str, str]] = (("content-type", "text/event-stream"),)
    body_pieces: Sequence[bytes] = ()
    framing: Framing = "chunked"
    end: End = "complete"
    pause_ms: float = 0.0
    stall_before_headers: bool = False
    hold_after_pieces: int | None = None
    content_length: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", tuple((str(n), str(v)) for n, v in self.headers))
        object.__setattr__(self, "body_pieces", tuple(bytes(p) for p in self.body_pieces))
        if not 100 <= self.status <= 999:
            raise ValueError(f"status {self.status} is not a 3-digit HTTP status")
        if self.framing not in ("chunked", "content-length", "close"):
            raise ValueError(f"unknown framing {self.framing!r}")
        if self.end not in ("complete", "drop", "reset", "stall"):
            raise ValueError(f"unknown end {self.end!r}")
        if self.framing == "chunked" and any(not p for p in self.body_pieces):
            raise ValueError("an empty piece would be the terminating chunk under chunked framing")
        if any(n.lower() in ("content-length", "transfer-encoding") for n, _ in self.headers):
            raise ValueError("framing headers come from `framing` and `content_length`, not `headers`")
        if self.content_length is not None and (self.framing != "content-length" or self.content_length < 0):
            raise ValueError("content_length needs framing='content-length' and a value >= 0")
        if self.pause_ms < 0:
            raise ValueError("pause_ms must be >= 0")

    @classmethod
    def sse(
        cls,
        body: bytes,
        *,
        split_at: Sequence[int] = (),
        status: int = 200,
        framing: Framing = "chunked",
        end: End = "complete",
        pause_ms: float = 0.0,
    ) -> ReplayScript:
        """An SSE response (``text/event-stream``) of ``body`` cut at the ``split_at`` offsets."""
        return cls(
            status=status,
            headers=(("content-type", "text/event-stream"), ("cache-control", "no-cache")),
            body_pieces=split_bytes(body, split_at),
            framing=framing,
            end=end,
            pause_ms=pause_ms,
        )

    @classmethod
    def json_response(
        cls, status: int, payload: object, *, headers: Sequence[tuple[str, str]] = ()
    ) -> ReplayScript:
        """A ``Content-Length`` JSON response, e.g. ``json_response(503, {"error": {...}})``."""
        body = json.dumps(payload).encode()
        all_headers = (("content-type", "application/json"), *headers)
        return cls(status=status, headers=all_headers, body_pieces=(body,), framing="content-length")

    def declared_length(self) -> int:
        """The ``Content-Length`` value written under ``content-length`` framing, in bytes."""
        if self.content_length is not None:
            return self.content_length
        written = sum(len(p) for p in self.body_pieces)
        return written if self.end == "complete" else written + 1


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """A request as the replay server read it; ``path`` is the request target (with query)."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    connection_index: int

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)

    def json(self) -> object:
        """The body decoded as JSON. Raises ``json.JSONDecodeError``."""
        return json.loads(self.body)


class _BadRequest(Exception):
    pass


class _Input:
    """Buffered reads from one connection; the buffer survives between requests."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._buffer = bytearray()

    async def _fill(self) -> bool:
        data = await self._reader.read(65536)
        self._buffer += data
        return bool(data)

    async def read_line(self) -> bytes | None:
        """One line including its LF; None at a clean EOF."""
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > _MAX_LINE_BYTES:
                raise _BadRequest("line too long")
            if not await self._fill():
                if self._buffer:
                    raise _BadRequest("truncated line")
                return None
        line = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        return line

    async def read_exact(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not await self._fill():
                raise _BadRequest("truncated body")
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def wait_closed(self) -> None:
        """Return when the peer has closed (EOF or reset); keeps any bytes it sent."""
        with contextlib.suppress(ConnectionError):
            while await self._fill():
                pass


class _ReleaseEvent(threading.Event):
    """A threading.Event whose ``set()`` also wakes stalls on the server's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self.on_loop = asyncio.Event()

    def set(self) -> None:
        super().set()
        with contextlib.suppress(RuntimeError):  # loop already closed: nothing is stalling
            self._loop.call_soon_threadsafe(self.on_loop.set)


class ReplayServer:
    """A running replay upstream; made by :func:`replay_server`.

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``; ``origin`` is the same without ``/v1``.
            Every path is answered from the script.
        requests: each request read, in arrival order (appended before it is answered).
        client_closed: set when a client closed a connection before its response was
            completely written.
        release: set it to end every stall (current and future ones).
        resume: set it to end every ``hold_after_pieces`` hold.
        connection_count: TCP connections accepted so far.
        errors: unexpected exceptions in the server; the first is re-raised on exit.
    """

    def __init__(self, sock: socket.socket, script: ReplayScript | Sequence[ReplayScript]) -> None:
        host, port = sock.getsockname()[:2]
        self.origin = f"http://{host}:{port}"
        self.base_url = self.origin + "/v1"
        self.requests: list[RecordedRequest] = []
        self.client_closed = threading.Event()
        #: set each time a request has been read (before it is answered)
        self.request_seen = threading.Event()
        self.connection_count = 0
        self.errors: list[BaseException] = []
        self._sock = sock
        self._scripts = [script] if isinstance(script, ReplayScript) else list(script)
        self._repeat = isinstance(script, ReplayScript)
        self._answered = 0
        self._loop = asyncio.new_event_loop()
        self.release = _ReleaseEvent(self._loop)
        self.resume = _ReleaseEvent(self._loop)
        self._stop = self._loop.create_future()
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, name="replay-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Close every connection, stop the loop and join the thread (at most 10 s)."""
        self.release.set()
        self.resume.set()
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(lambda: self._stop.done() or self._stop.set_result(None))
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            raise RuntimeError("replay server thread did not stop within 10 s")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        server = await asyncio.start_server(self._on_connection, sock=self._sock)
        await self._stop
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.wait_closed()

    def _next_script(self) -> ReplayScript:
        index = self._answered
        self._answered += 1
        if self._repeat:
            return self._scripts[0]
        if index < len(self._scripts):
            return self._scripts[index]
        return ReplayScript.json_response(500, _SCRIPT_EXHAUSTED)

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        index = self.connection_count
        self.connection_count += 1
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        source = _Input(reader)
        try:
            while True:
                request = await _read_request(source, writer, index)
                if request is None:
                    return
                self.requests.append(request)
                self.request_seen.set()
                if not await self._respond(self._next_script(), request, source, writer):
                    return
        except _BadRequest:
            writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        except ConnectionError:
            pass
        except asyncio.CancelledError:  # the server is stopping
            writer.transport.abort()
        except Exception as exc:  # noqa: BLE001 (a bug here must fail the test, not pass as a client error)
            self.errors.append(exc)
        finally:
            writer.close()  # flushes what is buffered, then FIN; a no-op after abort()
            self._tasks.discard(task)

    async def _respond(
        self, script: ReplayScript, request: RecordedRequest, source: _Input, writer: asyncio.StreamWriter
    ) -> bool:
        """Write one response; True when the connection may carry another request."""
        watcher = asyncio.ensure_future(source.wait_closed())
        try:
            if script.stall_before_headers and not await self._hold(watcher):
                return False
            writer.write(_head(script))
            await writer.drain()
            pieces = () if request.method == "HEAD" else script.body_pieces
            for number, piece in enumerate(pieces):
                if number and script.pause_ms and not await self._pause(watcher, script.pause_ms / 1000):
                    return False
                if number == script.hold_after_pieces and not await self._hold(watcher, self.resume):
                    return False
                if watcher.done():
                    self.client_closed.set()
                    return False
                writer.write(_frame(piece, script.framing))
                await writer.drain()
            return await self._finish(script, request, watcher, writer)
        except ConnectionError:
            self.client_closed.set()
            return False
        finally:
            watcher.cancel()
            await asyncio.wait({watcher})  # its pending read must end before the next one starts

    async def _finish(
        self,
        script: ReplayScript,
        request: RecordedRequest,
        watcher: asyncio.Future[None],
        writer: asyncio.StreamWriter,
    ) -> bool:
        if script.end == "drop":
            writer.close()
            return False
        if script.end == "reset":
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            writer.transport.abort()
            return False
        if script.end == "stall" and not await self._hold(watcher):
            return False
        written = sum(len(p) for p in script.body_pieces)
        if script.framing == "chunked" and request.method != "HEAD":
            writer.write(b"0\r\n\r\n")
        keep = (
            script.framing != "close"
            and (script.framing != "content-length" or script.declared_length() == written)
            and (request.header("connection") or "").lower() != "close"
            and ("close" not in {v.lower() for n, v in script.headers if n.lower() == "connection"})
        )
        if not keep:
            writer.close()
        return keep

    async def _hold(self, watcher: asyncio.Future[None], until: _ReleaseEvent | None = None) -> bool:
        """Write nothing until ``until`` (default ``release``) is set (True) or the client closes (False)."""
        released = asyncio.ensure_future((until or self.release).on_loop.wait())
        try:
            await asyncio.wait({watcher, released}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()
        if watcher.done():
            self.client_closed.set()
            return False
        return True

    async def _pause(self, watcher: asyncio.Future[None], seconds: float) -> bool:
        done, _ = await asyncio.wait({watcher}, timeout=seconds)
        if done:
            self.client_closed.set()
            return False
        return True


async def _read_request(source: _Input, writer: asyncio.StreamWriter, index: int) -> RecordedRequest | None:
    """Read one request (RFC 9112 sections 3, 5, 6, 7.1); None at a clean EOF."""
    line = await source.read_line()
    while line in (b"\r\n", b"\n"):  # RFC 9112 2.2: ignore empty lines before a request
        line = await source.read_line()
    if line is None:
        return None
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest("bad request line")
    method, path, _version = parts
    headers: list[tuple[str, str]] = []
    while (field := await source.read_line()) not in (b"\r\n", b"\n"):
        if field is None:
            raise _BadRequest("truncated head")
        name, colon, value = field.decode("latin-1").partition(":")
        if not colon:
            raise _BadRequest("bad header line")
        headers.append((name, value.strip()))
    lookup = {n.lower(): v for n, v in headers}
    if lookup.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in lookup.get("transfer-encoding", "").lower():
        body = await _read_chunked(source)
    else:
        body = await source.read_exact(int(lookup.get("content-length", "0") or 0))
    return RecordedRequest(method, path, tuple(headers), body, index)


async def _read_chunked(source: _Input) -> bytes:
    body = bytearray()
    while True:
        size_line = await source.read_line()
        if size_line is None:
            raise _BadRequest("truncated chunked body")
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            raise _BadRequest("bad chunk size") from None
        if size == 0:
            while (trailer := await source.read_line()) not in (b"\r\n", b"\n"):
                if trailer is None:
                    raise _BadRequest("truncated trailers")
            return bytes(body)
        body += await source.read_exact(size)
        await source.read_exact(2)


def _head(script: ReplayScript) -> bytes:
    try:
        reason = http.HTTPStatus(script.status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {script.status} {reason}", *(f"{n}: {v}" for n, v in script.headers)]
    if script.framing == "chunked":
        lines.append("transfer-encoding: chunked")
    elif script.framing == "content-length":
        lines.append(f"content-length: {script.declared_length()}")
    else:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _frame(piece: bytes, framing: Framing) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece) if framing == "chunked" else piece


@contextlib.contextmanager
def replay_server(
    script: ReplayScript | Sequence[ReplayScript], *, host: str = "127.0.0.1"
) -> Iterator[ReplayServer]:
    """Serve ``script`` on a free loopback port in a background thread.

    A single :class:`ReplayScript` answers every request; a sequence answers successive
    requests in order (across connections), and requests beyond it get a 500 JSON error
    (still recorded, so a test can assert how many requests came). Yields the
    :class:`ReplayServer`; on exit every connection is closed and the thread joined, and
    the first unexpected server-side exception is re-raised.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    server = ReplayServer(sock, script)
    server.start()
    try:
        yield server
    finally:
        server.stop()
    if server.errors:
        raise server.errors[0]


def split_points(data: bytes, how: SplitHow, *, seed: int = 0, count: int | None = None) -> list[int]:
    """Offsets ``0 < p < len(data)`` at which to cut ``data`` into separate reads.

    ``how``: ``"bytes"`` every offset (one byte per read); ``"utf8"`` every offset inside
    a multi-byte UTF-8 character (before each continuation byte); ``"crlf"`` between each
    CR and its LF; ``"events"`` after each SSE event's blank line (``\\n\\n``, ``\\r\\n\\r\\n``
    or ``\\r\\r``, per the WHATWG SSE spec's line endings), as an upstream flushing per
    event would; ``"random"`` ``count`` distinct offsets (default ``len(data) // 64``,
    at least 1) drawn with ``random.Random(seed)``: deterministic for a seed.
    """
    inner = range(1, len(data))
    if how == "bytes":
        return list(inner)
    if how == "utf8":
        return [i for i in inner if data[i] & 0xC0 == 0x80]
    if how == "crlf":
        return [i for i in inner if data[i - 1 : i + 1] == b"\r\n"]
    if how == "events":
        ends = (b"\r\n\r\n", b"\n\n", b"\r\r")
        return [i for i in inner if any(data[max(0, i - len(e)) : i] == e for e in ends)]
    if how == "random":
        wanted = count if count is not None else max(1, len(data) // 64)
        return sorted(random.Random(seed).sample(inner, min(wanted, len(inner))))
    raise ValueError(f"unknown split {how!r}; expected bytes, utf8, crlf, events or random")


def split_bytes(data: bytes, points: Sequence[int]) -> list[bytes]:
    """``data`` cut at ``points`` (offsets as from :func:`split_points`); empty pieces dropped."""
    cuts = [0, *sorted(set(points)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(cuts) if b > a]


@dataclasses.dataclass(frozen=True)
class StreamExpect:
    """What a correct relay derives from a fixture stream (``NAME.expect.json``).

    ``content_chunks``: data events whose choices carry non-empty ``delta.content``,
    ``delta.reasoning_content`` or ``delta.tool_calls``. ``text``: all ``delta.content``
    in wire order; ``text_by_choice``: per choice index. ``usage``: ``prompt_tokens`` and
    ``completion_tokens`` as the upstream reported them, or None. ``done``: the stream
    ends with ``data: [DONE]``. ``error``: the ``error`` object of an error event, or None.
    """

    content_chunks: int
    text: str
    reasoning_text: str
    text_by_choice: dict[int, str]
    tool_calls: list[dict[str, object]]
    finish_reasons: dict[int, str]
    usage: dict[str, int] | None
    done: bool
    error: dict[str, object] | None


def stream_fixture_names() -> list[str]:
    """Names of the fixture streams (``NAME.sse`` files), sorted."""
    return sorted(p.name.removesuffix(".sse") for p in STREAMS_DIR.glob("*.sse"))


def load_stream(name: str) -> bytes:
    """The bytes of ``tests/fixtures/streams/NAME.sse``, exactly as on the wire."""
    return (STREAMS_DIR / f"{name}.sse").read_bytes()


def dechunked(raw: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body (RFC 9112 section 7.1), for recorded wire
    bytes: a recording cut part-way gives what arrived before the cut."""
    body, at = b"", 0
    while True:
        line_end = raw.find(b"\r\n", at)
        if line_end < 0:
            return body
        size = int(raw[at:line_end], 16)
        if size == 0:
            return body
        start = line_end + 2
        body += raw[start : start + size]
        at = start + size + 2


def load_expect(name: str) -> StreamExpect:
    """The facts in ``tests/fixtures/streams/NAME.expect.json``."""
    raw = json.loads((STREAMS_DIR / f"{name}.expect.json").read_text(encoding="utf-8"))
    raw["text_by_choice"] = {int(k): v for k, v in raw["text_by_choice"].items()}
    raw["finish_reasons"] = {int(k): v for k, v in raw["finish_reasons"].items()}
    return StreamExpect(**raw)
