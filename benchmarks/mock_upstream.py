"""A zero-delay OpenAI-shaped mock upstream for the overhead benchmark: raw asyncio
HTTP/1.1 on uvloop, keep-alive, as cheap as it gets, so what a gateway adds shows.

Answers any POST by looking at its body (after dropping spaces):

- ``"stream":true`` and the model ``bench-paced``: a paced SSE stream, one content
  chunk every ``PACE_MS`` ms (``PACED_CHUNKS`` of them), each its own write;
- ``"stream":true`` otherwise: ``CHUNKS`` content chunks written back to back, each its
  own write (an engine flushing per token), with a role chunk first and a usage chunk
  and ``[DONE]`` last;
- anything else: one chat completion object (``content-length``).

GET ``/v1/models`` (peers probe it) and ``/health`` answer small JSON bodies. A request
with ``connection: close`` has its connection closed after its answer.

    python benchmarks/mock_upstream.py [--pace-ms MS] [--paced-chunks N] PORT [PORT ...]
    (one server on each port; the paced stream's pace and length, default 20 ms, 32)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket

CHUNKS = 64
#: Bodies larger than this are searched for ``"stream": true`` as sent, not compacted first.
LARGE_BODY_BYTES = 1 << 20
PACED_CHUNKS = 32
PACE_MS = 20.0
CHUNK = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n'
)
ROLE = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
)
USAGE = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench",'
    b'"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":64,"total_tokens":72}}\n\n'
)
DONE = b"data: [DONE]\n\n"
JSON_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello " * 64}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 64, "total_tokens": 72},
    }
).encode()
MODELS_BODY = b'{"object":"list","data":[{"id":"bench","object":"model","created":0,"owned_by":"bench"}]}'
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunked(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


def _json_response(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


_ROLE_C, _CHUNK_C, _USAGE_C, _DONE_C = (_chunked(p) for p in (ROLE, CHUNK, USAGE, DONE))
_END_C = b"0\r\n\r\n"
_JSON_RESPONSE = _json_response(JSON_BODY)
_MODELS_RESPONSE = _json_response(MODELS_BODY)


class MockUpstream(asyncio.Protocol):
    """One client connection; requests are answered in order (no pipelining needed)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.buf = bytearray()
        self.closed = False
        self.close_after = False
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                eol = head.find(b"\r\n", at)
                length = int(head[at + 15 : eol if eol > 0 else len(head)])
            if len(self.buf) < head_end + 4 + length:
                return
            body = bytes(self.buf[head_end + 4 : head_end + 4 + length])
            if length <= LARGE_BODY_BYTES:
                body = body.replace(b" ", b"")
            # (a large body is searched as sent: compacting its copy would take a while)
            streamed = b'"stream":true' in body or b'"stream": true' in body
            del self.buf[: head_end + 4 + length]
            self.close_after = b"connection: close" in head
            if head.startswith(b"get"):
                self.transport.write(_MODELS_RESPONSE)
                self._answered()
            elif streamed:
                if b'"bench-paced"' in body:
                    self.transport.write(STREAM_HEAD + _ROLE_C)
                    asyncio.get_running_loop().call_later(PACE_MS / 1000, self._pace, PACED_CHUNKS)
                else:
                    asyncio.get_running_loop().create_task(self._burst())
            else:
                self.transport.write(_JSON_RESPONSE)
                self._answered()

    def _answered(self) -> None:
        if self.close_after:
            self.transport.close()

    async def _burst(self) -> None:
        write = self.transport.write
        write(STREAM_HEAD + _ROLE_C)
        for _ in range(CHUNKS):
            await asyncio.sleep(0)  # one write per event, each its own loop turn
            write(_CHUNK_C)
        write(_USAGE_C + _DONE_C + _END_C)
        self._answered()

    def _pace(self, left: int) -> None:
        if self.closed:
            return
        if left > 0:
            self.transport.write(_CHUNK_C)
            asyncio.get_running_loop().call_later(PACE_MS / 1000, self._pace, left - 1)
        else:
            self.transport.write(_USAGE_C + _DONE_C + _END_C)
            self._answered()


def serve(*ports: int) -> None:
    """Serve on 127.0.0.1 at each of ``ports`` until killed."""
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        servers = [await loop.create_server(MockUpstream, "127.0.0.1", port, backlog=4096) for port in ports]
        await asyncio.gather(*(server.serve_forever() for server in servers))

    uvloop.run(main())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pace-ms", type=float, default=PACE_MS)
    parser.add_argument("--paced-chunks", type=int, default=PACED_CHUNKS)
    parser.add_argument("ports", type=int, nargs="+")
    options = parser.parse_args()
    PACE_MS, PACED_CHUNKS = options.pace_ms, options.paced_chunks
    serve(*options.ports)
