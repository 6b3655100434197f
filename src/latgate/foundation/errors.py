"""Gateway errors: a small typed tree rendered to the OpenAI error envelope in one place.

::

    GatewayError                 (status, OpenAI ``type``, ``code``, ``param``)
    ├── InvalidRequest           400 invalid_request_error
    │   ├── BodyTooLarge         413
    │   └── ContextLengthExceeded  400, code context_length_exceeded
    ├── AuthenticationFailed     401 authentication_error
    ├── PermissionDenied         403 permission_error
    ├── NotFound                 404 invalid_request_error, code model_not_found / not_found
    ├── RateLimited              429 rate_limit_error
    ├── ClientClosedRequest      499: the client went away before the answer began
    ├── Overloaded               503 api_error, code overloaded: latgate's own limit
    └── UpstreamError            the upstream's status (502 when it sent none), api_error
        ├── UpstreamUnavailable  502/503: connection refused, reset, DNS
        ├── UpstreamTimeout      504: connect / first-token / read timeout
        └── UpstreamClientError  400/404/413/422: the upstream's own error object, as written

The envelope is ``{"error": {"message", "type", "param", "code"}}`` as in the OpenAI API
reference ("Error codes"; schema ``ErrorResponse`` in the OpenAPI spec). Messages never
carry an upstream URL or key: callers give the provider *name*.
"""

from __future__ import annotations

import orjson


class GatewayError(Exception):
    """Base class. ``status`` is the HTTP status sent to the client."""

    status: int = 500
    type: str = "api_error"
    code: str | None = None
    #: why an upstream could not be had (``connection refused``...), for the access log
    cause: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.headers = headers or {}

    def envelope(self) -> dict[str, dict[str, object]]:
        """The OpenAI error envelope for this error."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        """The envelope as JSON bytes."""
        return orjson.dumps(self.envelope())


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class BodyTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class UnsupportedMediaType(InvalidRequest):
    """A request body latgate cannot read: compressed (``Content-Encoding``) or of a
    type that is not JSON (RFC 9110 section 15.5.16)."""

    status = 415
    code = "unsupported_media_type"


class ContextLengthExceeded(InvalidRequest):
    """The prompt fits no candidate's context window (``[models.X] max_context_tokens``,
    or the windows the engines report): answered before any upstream call. OpenAI's
    own code for a prompt over the window."""

    code = "context_length_exceeded"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class ClientClosedRequest(GatewayError):
    """The client disconnected while latgate waited for the upstream (nginx's 499)."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"


class Overloaded(GatewayError):
    """latgate's own limit was reached (an upstream pool full, no descriptor): the
    client may retry shortly; never the upstream's failure (Envoy's local overflow
    503 with ``x-envoy-overloaded``)."""

    status = 503
    type = "api_error"
    code = "overloaded"


class UpstreamError(GatewayError):
    status = 502
    type = "api_error"
    code = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    status = 502
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamClientError(UpstreamError):
    """The upstream's answer to a request it found faulty (400, 404, 413, 422), relayed
    with the upstream's status and its error object as the upstream wrote it
    (``message``, ``type``, ``param``, ``code``, any other field; already redacted),
    so a client sees the engine's own words (vLLM's context-length 400, its 404 listing
    the models it serves). Which provider answered goes in ``X-Latgate-Provider``."""

    code = "upstream_client_error"  # the access log's error kind, not in the envelope

    def __init__(self, error: dict[str, object], *, status: int) -> None:
        message = error.get("message")
        super().__init__(message if isinstance(message, str) else f"HTTP {status}", status=status)
        self.error = error

    def envelope(self) -> dict[str, dict[str, object]]:
        return {"error": self.error}


def error_body(
    message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> bytes:
    """An OpenAI error envelope as bytes, for callers that have no exception at hand."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})
