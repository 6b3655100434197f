"""ASGI plumbing for the simulator: reading bodies, sending responses, watching for disconnects.

Per the ASGI 3 HTTP spec, a server delivers ``http.disconnect`` from ``receive()`` once
the client has gone; the simulator runs each reply next to a task waiting for it, since
uvicorn silently drops ``send()`` calls after a disconnect instead of raising.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class Outcome(enum.Enum):
    """How a reply ended."""

    COMPLETED = "completed"
    DROPPED = "dropped"
    DISCONNECTED = "disconnected"


def request_id(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The request's ``X-Request-Id`` header, to echo back (empty when absent)."""
    for name, value in scope["headers"]:
        if name.lower() == b"x-request-id":
            return [(b"x-request-id", value)]
    return []


async def send_bytes(send: Send, status: int, body: bytes, *, headers: list[tuple[bytes, bytes]]) -> None:
    """A complete response with ``content-length``."""
    headers = headers + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or ``None`` when the client left before sending it."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has gone (the request body was already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, work: Coroutine[Any, Any, Outcome]) -> Outcome:
    """Run ``work``; cancel it and return DISCONNECTED if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is shutting down
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.wait((task,))
        return Outcome.DISCONNECTED
    try:
        return task.result()
    except OSError:  # some ASGI servers raise when writing to a closed connection
        return Outcome.DISCONNECTED


async def serve_non_http(scope: Scope, receive: Receive, send: Send) -> bool:
    """Answer a scope that is not an HTTP request: the lifespan protocol (nothing to
    start or stop) or any other type (ignored). Returns ``True`` when it did, ``False``
    for an HTTP scope, which the caller answers."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return True
    return scope["type"] != "http"


async def lifespan(receive: Receive, send: Send) -> None:
    """Answer the ASGI lifespan protocol (nothing to start or stop)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
