"""What a client connection is held to, and the answers it gets when it breaks a limit:
the head limits, :class:`ClientLimits` (timeouts, the connection cap, how refusals are
recorded and in which envelope), and the whole HTTP/1.1 error responses written before
any request reaches the app (:func:`envelope`). :mod:`latgate.app.httplimits` enforces them
on uvicorn's httptools protocol (its docstring says which status each limit gives)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

MAX_HEAD_BYTES = 64 * 1024
MAX_FIELD_BYTES = 16 * 1024
MAX_FIELDS = 100


def _ignore(status: int, kind: str, path: str) -> str | None:
    return None


#: an error answer's JSON body and its extra header fields
ErrorAnswer = tuple[bytes, list[tuple[bytes, bytes]]]


def openai_error_body(path: str, status: int, message: str, code: str, request_id: str) -> ErrorAnswer:
    """The OpenAI error envelope as JSON bytes (for any ``path``), with ``x-request-id``."""
    return _openai_error(message, kind="invalid_request_error", code=code), [(b"x-request-id", request_id.encode())]


def _openai_error(message: str, *, kind: str, code: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


@dataclass(frozen=True)
class ClientLimits:
    """What :func:`client_protocol` enforces (seconds; ``None``: no limit).

    Attributes:
        header_timeout_sec: time to receive a complete request head.
        body_timeout_sec: longest gap while receiving a request body.
        send_timeout_sec: longest time response bytes may stay unread.
        max_connections: client connections served at once; more are refused (503).
        on_refused: ``(status, kind, path)`` for a refusal the app never saw
            (``header_timeout`` 408, ``connection_limit`` 503, ``malformed_head`` 400,
            ``head_too_large`` 431); records the access line and metric and returns
            its request id, which the answer carries as ``x-request-id`` (``None``: no
            id).
        error_body: ``(path, status, message, code, request_id)`` -> the JSON error
            body and the header fields (``x-request-id``...) a request to ``path``
            gets when its body stalls (the envelope of the API there: Anthropic's on
            ``/v1/messages``); OpenAI's by default.
    """

    header_timeout_sec: float | None = None
    body_timeout_sec: float | None = None
    send_timeout_sec: float | None = None
    max_connections: int | None = None
    on_refused: Callable[[int, str, str], str | None] = _ignore
    error_body: Callable[[str, int, str, str, str], ErrorAnswer] = openai_error_body


def envelope(
    status: int,
    reason: str,
    message: str,
    *,
    code: str,
    kind: str = "invalid_request_error",
    body: bytes | None = None,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> bytes:
    """A whole HTTP/1.1 response: ``status reason``, ``headers``, ``body`` (by default an
    OpenAI error envelope) as JSON, ``connection: close``."""
    if body is None:
        body = _openai_error(message, kind=kind, code=code)
    fields = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%sconnection: close\r\n\r\n"
        % (status, reason.encode(), len(body), fields)
    )
    return head + body
