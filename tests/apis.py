"""The APIs of latgate's route table (:data:`latgate.api.routes.APIS`) as tests use them:
a body each accepts, the raw request head to send it, and its error envelope read back.
Tests parametrize over :data:`APIS` (or :data:`RELAYED`, :data:`STREAMED`) so every API
gets the same test."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from latgate.api.routes import APIS as TABLE
from latgate.api.serve import Api

HI = [{"role": "user", "content": "hi"}]
#: A body each API accepts, by :attr:`Api.name` (model ``m``).
BODIES: dict[str, dict[str, Any]] = {
    "/chat/completions": {"model": "m", "messages": HI},
    "/completions": {"model": "m", "prompt": "hi"},
    "/embeddings": {"model": "m", "input": "hi"},
    "/responses": {"model": "m", "input": "hi"},
    "/messages": {"model": "m", "max_tokens": 16, "messages": HI},
    "/messages/count_tokens": {"model": "m", "messages": HI},
}


def _params(apis: list[Api]) -> list[Any]:
    return [pytest.param(api, id=api.name.strip("/").replace("/", "-")) for api in apis]


#: Every API.
APIS = _params(list(TABLE))
#: The APIs whose answer comes from a provider (all but count_tokens).
RELAYED = _params([api for api in TABLE if api.answer_schema is None])
#: The relayed APIs that can answer with a stream.
STREAMED = _params([api for api in TABLE if api.answer_schema is None and api.streams])


def body_for(api: Api, *, stream: bool = False) -> dict[str, Any]:
    """:data:`BODIES`' body for ``api``, streamed when ``stream``."""
    body = dict(BODIES[api.name])
    if stream:
        body["stream"] = True
    return body


def post_head(api: Api, *, content_length: int, headers: bytes = b"") -> bytes:
    """A request head POSTing ``content_length`` bytes of JSON to ``api``'s first path
    (``headers``: more fields, each ending in CRLF)."""
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
        % (api.paths[0].encode(), content_length, headers)
    )


def read_answer(conn: socket.socket, *, timeout: float = 10.0) -> tuple[bytes, dict]:
    """One whole answer with a ``content-length`` (its status line and JSON body),
    without waiting for the connection to close."""
    conn.settimeout(timeout)
    received = b""
    while b"\r\n\r\n" not in received:
        received += conn.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(int(f.split(b":", 1)[1]) for f in head.split(b"\r\n") if f.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += conn.recv(65536)
    return head.partition(b"\r\n")[0], json.loads(body)


def error_type(api: Api, body: dict[str, Any]) -> str:
    """The error ``type`` of an error answer, asserting it is in ``api``'s envelope
    (Anthropic's ``{"type": "error", "error": {...}}`` or OpenAI's ``{"error": {...}}``)."""
    if api.envelope.schema == "AnthropicError":
        assert body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body) == {"error"}, body
        assert {"message", "type", "param", "code"} <= set(body["error"]), body
    return body["error"]["type"]
