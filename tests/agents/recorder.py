"""An ASGI wrapper that keeps every HTTP request reaching the gateway, for the report of
what each agent sent."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Seen:
    """One request: method, path, query, lower-cased headers, parsed JSON body (or
    ``None``), and when its body had arrived (``time.perf_counter()`` seconds)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    at: float


class RecordingApp:
    """Wraps an ASGI app; ``seen`` lists the requests in arrival order (thread-safe)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[Seen] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def tapped() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self._record(scope, b"".join(chunks))
            return message

        if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            self._record(scope, b"")
            await self.app(scope, receive, send)
            return
        await self.app(scope, tapped, send)

    def _record(self, scope: dict, raw: bytes) -> None:
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = scope.get("query_string", b"").decode("latin-1")
        seen = Seen(scope["method"], scope["path"], query, headers, body, time.perf_counter())
        with self._lock:
            self.seen.append(seen)


def describe(seen: list[Seen]) -> str:
    """A short account of what an agent sent: each distinct request line, the body fields
    and tool counts of its first model request, and the notable headers."""
    lines = []
    counts: dict[str, int] = {}
    for request in seen:
        line = f"{request.method} {request.path}" + (f"?{request.query}" if request.query else "")
        counts[line] = counts.get(line, 0) + 1
    lines.append("requests: " + ", ".join(f"{line} x{n}" for line, n in counts.items()))
    model_requests = [r for r in seen if isinstance(r.body, dict)]
    if model_requests:
        first = model_requests[0]
        body = first.body
        fields = []
        for key, value in body.items():
            if key in ("messages", "input", "tools", "system"):
                fields.append(f"{key}[{len(value)}]" if isinstance(value, list) else key)
            elif isinstance(value, (dict, list)):
                fields.append(f"{key}={orjson.dumps(value).decode()[:80]}")
            else:
                fields.append(f"{key}={str(value)[:40]}")
        lines.append("first body: " + ", ".join(fields))
        skip = {"host", "content-length", "accept", "accept-encoding", "connection", "content-type"}
        headers = sorted(k for k in first.headers if k not in skip)
        lines.append("headers: " + ", ".join(headers))
    return "\n".join(lines)
