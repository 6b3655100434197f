"""A whole (non-streamed) upstream answer sent to the client as a raw ASGI response
(:class:`Answer`). Where its JSON begins past an upstream's keep-alives is read in the
transport (:mod:`latgate.transport.prelude`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Answer:
    """The client's response for a non-streamed request: status 200, ``headers`` plus
    ``content-length``, ``body``; ``on_sent`` runs once the body was handed to the server
    (so e2e latency includes writing it).

    Why not Starlette's ``Response`` with a background task: the same two ASGI messages
    (ASGI spec, HTTP: ``http.response.start`` and ``http.response.body``) at a fraction
    of its cost (docs/performance.md, "Why the hot path is written as it is").

    Args:
        body: the answer's bytes (JSON).
        headers: encoded ``(name, value)`` pairs, lower-case names, without
            ``content-length``.
        on_sent: called after the body was sent (or the client had gone).
    """

    __slots__ = ("body", "headers", "on_sent", "status_code")

    def __init__(self, *, body: bytes, headers: list[tuple[bytes, bytes]], on_sent: Callable[[], None]) -> None:
        self.status_code = 200
        self.body = body
        self.headers = headers
        self.on_sent = on_sent

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*self.headers, (b"content-length", b"%d" % len(self.body))],
                }
            )
            await send({"type": "http.response.body", "body": self.body})
        finally:
            self.on_sent()
