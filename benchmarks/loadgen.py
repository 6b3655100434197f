"""A lean HTTP/1.1 load generator for the overhead benchmark (raw asyncio protocol on
uvloop, keep-alive), cheap enough to share a core with the mock upstream.

:func:`run_load` keeps ``concurrency`` connections busy for ``seconds`` with one POST
after another and returns every finished request's latency, time to first body byte
and, for streams, the gaps between reads that carried body bytes (inter-chunk times).
Responses are framed by ``content-length`` or ``transfer-encoding: chunked`` (RFC 9112
sections 6 and 7.1); ``connection: close`` makes the slot reconnect.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    """Raw samples of one run; times in milliseconds."""

    seconds: float = 0.0
    latency_ms: list[float] = field(default_factory=list)
    ttfc_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    reads: int = 0
    errors: int = 0


class Conn(asyncio.Protocol):
    """One keep-alive client connection: ``await send(request)`` returns when the whole
    response arrived (``status``, ``first`` byte time, ``reads``, gaps between reads)."""

    def __init__(self, *, gaps: bool) -> None:
        self.gaps = gaps
        self.closed = False
        self.waiter: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed"))

    def send(self, request: bytes) -> asyncio.Future:
        self.buf = b""
        self.head_done = False
        self.status = 0
        self.length = -1  # -1: chunked
        self.close_after = False
        self.chunk_left = 0  # bytes of the current chunk (plus CRLF) still to come
        self.first = 0.0
        self.last = 0.0
        self.gap_list: list[float] = []
        self.reads = 0
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.head_done:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            self.status = int(head[9:12])
            self.head_done = True
            at = head.find(b"content-length:")
            if at >= 0:
                eol = head.find(b"\r\n", at)
                self.length = int(head[at + 15 : eol if eol > 0 else len(head)])
            self.close_after = b"connection: close" in head
            data = self.buf[end + 4 :]
            self.buf = b""
            if not data and self.length != 0:
                return
        if data:
            self.reads += 1
            if self.first == 0.0:
                self.first = self.last = now
            elif self.gaps:
                self.gap_list.append((now - self.last) * 1000)
                self.last = now
        if self.length >= 0:
            self.length -= len(data)
            if self.length <= 0:
                self._done(now)
            return
        self._chunked(data, now)

    def _chunked(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        while True:
            if self.chunk_left:
                take = min(self.chunk_left, len(buf) - pos)
                self.chunk_left -= take
                pos += take
                if self.chunk_left:
                    self.buf = b""
                    return
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                self.buf = buf[pos:]
                return
            size = int(buf[pos:eol].split(b";")[0], 16)
            if size == 0:  # last chunk; trailers are not expected
                self.buf = b""
                self._done(now)
                return
            pos = eol + 2
            self.chunk_left = size + 2

    def _done(self, now: float) -> None:
        if self.close_after:
            self.transport.close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(now)


def request_bytes(*, port: int, path: str, body: bytes) -> bytes:
    """A keep-alive JSON POST."""
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer sk-bench\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def run_load(
    *, port: int, request: bytes, concurrency: int, seconds: float, gaps: bool = False
) -> LoadResult:
    """``concurrency`` connections sending ``request`` back to back for ``seconds``
    (requests in flight at the end are waited for, at most 60 s)."""
    loop = asyncio.get_running_loop()
    result = LoadResult()
    deadline = time.perf_counter() + seconds

    async def slot() -> None:
        conn: Conn | None = None
        while time.perf_counter() < deadline:
            if conn is None or conn.closed:
                _, conn = await loop.create_connection(lambda: Conn(gaps=gaps), "127.0.0.1", port)
            start = time.perf_counter()
            try:
                end = await conn.send(request)
            except ConnectionError:
                result.errors += 1
                conn = None
                continue
            if conn.status != 200:
                result.errors += 1
                continue
            result.latency_ms.append((end - start) * 1000)
            result.ttfc_ms.append(((conn.first or end) - start) * 1000)
            result.reads += conn.reads
            if gaps:
                result.gaps_ms.extend(conn.gap_list)
        if conn is not None:
            conn.transport.close()

    started = time.perf_counter()
    tasks = [loop.create_task(slot()) for _ in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=seconds + 60)
    for task in pending:
        task.cancel()
        result.errors += 1
    result.seconds = time.perf_counter() - started
    return result
