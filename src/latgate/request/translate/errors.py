"""The Anthropic error envelope for gateway errors.

Source: the Anthropic API reference ("Errors"): bodies are
``{"type": "error", "error": {"type": ..., "message": ...}}``; the error ``type`` goes
with the HTTP status (400 ``invalid_request_error``, 401 ``authentication_error``, 402
``billing_error``, 403 ``permission_error``, 404 ``not_found_error``, 413
``request_too_large``, 429 ``rate_limit_error``, 500 ``api_error``, 504
``timeout_error``, 529 ``overloaded_error``). In a stream the same object is the data of
an ``event: error`` SSE event.
"""

from __future__ import annotations

import orjson

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """The Anthropic error ``type`` for an HTTP status (other 4xx: invalid request; 5xx: api_error)."""
    known = _TYPE_BY_STATUS.get(status)
    if known is not None:
        return known
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_error_body(*, status: int, message: str, request_id: str | None = None) -> bytes:
    """``{"type": "error", "error": {"type", "message"}, "request_id"}`` as JSON bytes."""
    body: dict[str, object] = {
        "type": "error",
        "error": {"type": anthropic_error_type(status), "message": message},
    }
    if request_id:
        body["request_id"] = request_id
    return orjson.dumps(body)


def anthropic_error_event(*, status: int, message: str) -> bytes:
    """One ``event: error`` SSE event (a failure after the stream began)."""
    return b"event: error\ndata: " + anthropic_error_body(status=status, message=message) + b"\n\n"
