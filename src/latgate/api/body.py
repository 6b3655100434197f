"""Reading and validating request bodies, and rendering errors."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from latgate.forwarding.largebody import LARGE_BODY_BYTES, join_and_parse, release_when_freed
from latgate.foundation.errors import (
    BodyTooLarge,
    ClientClosedRequest,
    GatewayError,
    InvalidRequest,
    UnsupportedMediaType,
)

T = TypeVar("T")


class ClientBody(dict[str, Any]):
    """A request body parsed from JSON: a plain ``dict`` of its members that can be
    weakly referenced (a large body's memory is released off the event loop once it is
    freed: :func:`latgate.forwarding.largebody.release_when_freed`)."""

    __slots__ = ("__weakref__",)


class ProxyRequest(Request):
    """A Starlette request whose ``headers`` is a plain ``dict`` of lower-case names
    (the ASGI spec lower-cases them; a repeated field keeps its first value, as
    Starlette's ``Headers.get`` does).

    Why: routing, auth and the request id look up about ten headers per proxied
    request, most of them absent; Starlette's ``Headers`` finds each by a linear scan
    and an absent one through a ``KeyError``, a dict by one hash lookup (the costs:
    docs/performance.md).
    """

    # A dict, not Starlette's Headers (see above): latgate reads it as a Mapping, and
    # what Starlette itself reads of a request's headers (.get, [name]) a dict has
    @property
    def headers(self) -> dict[str, str]:  # type: ignore[override]
        headers = self.__dict__.get("_plain_headers")
        if headers is None:
            headers = {}
            for name, value in self.scope["headers"]:
                key = name.decode("latin-1")
                if key not in headers:
                    headers[key] = value.decode("latin-1")
            self.__dict__["_plain_headers"] = headers
        return headers


#: Body types read as JSON besides ``application/json`` and ``*/*+json`` (RFC 6839):
#: ``curl -d`` sends ``application/x-www-form-urlencoded`` when no type is given, and a
#: quick ``curl -d '{...}'`` means JSON.
JSON_READ_TYPES = frozenset({"application/json", "application/x-www-form-urlencoded"})
#: How much of a refused Content-Type or Content-Encoding the 415 repeats.
MAX_SHOWN_MEDIA_CHARS = 64


def media_problem(headers: Mapping[str, str]) -> str | None:
    """Why a body sent with these request headers cannot be read as JSON, or None: a
    ``Content-Encoding`` other than ``identity`` (latgate does not decompress request
    bodies), or a ``Content-Type`` that is not JSON (:data:`JSON_READ_TYPES`, a
    ``+json`` type, or none at all)."""
    encoding = headers.get("content-encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        shown = encoding.strip()[:MAX_SHOWN_MEDIA_CHARS]
        return f"request body Content-Encoding {shown!r} is not supported; send the JSON body uncompressed"
    content_type = headers.get("content-type")
    if content_type is None:
        return None
    media_type = content_type.split(";", 1)[0].strip().lower()
    if not media_type or media_type in JSON_READ_TYPES or media_type.endswith("+json"):
        return None
    shown = content_type.split(";", 1)[0].strip()[:MAX_SHOWN_MEDIA_CHARS]
    return f"request body Content-Type {shown!r} is not supported; send a JSON object as application/json"


async def read_json_object(request: Request, *, max_bytes: int) -> ClientBody:
    """The request body as a JSON object, read at most ``max_bytes`` bytes, parsed once
    (what goes upstream is encoded from this parse: :func:`latgate.forwarding.wire.upstream_payload`).

    Raises:
        UnsupportedMediaType: compressed, or not sent as JSON (:func:`media_problem`;
            415, before anything is read).
        BodyTooLarge: the declared or actual size exceeds ``max_bytes`` (413).
        InvalidRequest: not valid UTF-8 JSON, or not an object (400).
    """
    problem = media_problem(request.headers)
    if problem is not None:
        raise UnsupportedMediaType(problem)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(f"request body of {int(declared)} bytes exceeds the limit of {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:  # the ASGI messages themselves: Starlette's request.stream() is an async generator around them
        message = await request.receive()
        if message["type"] != "http.request":  # http.disconnect: gone while sending its body
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        if chunk:
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(f"request body exceeds the limit of {max_bytes} bytes")
            chunks.append(chunk)
    if not size:
        raise InvalidRequest("request body is empty; expected a JSON object", code="invalid_json")
    try:
        if size > LARGE_BODY_BYTES:  # joined and parsed off the event loop, in slices (latgate.forwarding.largebody)
            body = await asyncio.to_thread(join_and_parse, chunks)
        else:
            raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            body = orjson.loads(raw)
    except (orjson.JSONDecodeError, ValueError, RecursionError) as exc:
        if "utf-8" in str(exc).lower():  # orjson's words ("str is not valid UTF-8: surrogates not allowed", at char 0) say less
            why = "request body is not valid UTF-8: send JSON text encoded as UTF-8"
        else:
            why = f"request body is not valid JSON: {str(exc).splitlines()[0]}"
        raise InvalidRequest(why, code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_type")
    parsed = ClientBody(body)
    if size > LARGE_BODY_BYTES:
        release_when_freed(parsed)
    return parsed


def require(body: dict[str, Any], field: str, kind: type | tuple[type, ...], *, what: str) -> Any:
    """``body[field]`` when present and of ``kind``.

    Raises:
        InvalidRequest: missing or of the wrong type, naming ``field`` as ``param``.
    """
    value = body.get(field)
    if value is None:
        raise InvalidRequest(f"'{field}' is required", param=field, code="missing_required_parameter")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidRequest(f"'{field}' must be {what}", param=field, code="invalid_type")
    return value


#: The largest token limit accepted: a 32-bit signed integer, the most OpenAI's API
#: and the engines' int32 parameters take.
MAX_TOKEN_LIMIT = 2**31 - 1

#: Every token-limit field a request body of any route may carry (``/admin/route`` takes
#: the body of any of them).
TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def check_token_limits(body: Mapping[str, Any], fields: tuple[str, ...]) -> None:
    """Refuse a token-limit field (``max_tokens``, ``max_output_tokens``...) of ``body``
    that no engine can take, saying what is wrong; absent or ``null`` ones pass. A float
    is refused even when whole (``64.0``), as OpenAI's API refuses one for an integer field.

    Raises:
        InvalidRequest: (400, ``param`` the field) not a number (code ``invalid_type``),
            not a whole number (``invalid_type``), under 1 (``integer_below_min_value``),
            over :data:`MAX_TOKEN_LIMIT` (``integer_above_max_value``) or a whole float
            (``invalid_type``), OpenAI's codes.
    """
    for field in fields:
        value = body.get(field)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            kind = "a string" if isinstance(value, str) else f"a JSON {_json_kind(value)}"
            raise InvalidRequest(
                f"'{field}' must be an integer number of tokens, not {kind}", param=field, code="invalid_type"
            )
        if isinstance(value, float) and not value.is_integer():  # orjson reads no NaN or infinity
            raise InvalidRequest(
                f"'{field}' must be a whole number of tokens, not {value!r}", param=field, code="invalid_type"
            )
        if value < 1:
            raise InvalidRequest(
                f"'{field}' must be at least 1 token, not {value:.15g}", param=field, code="integer_below_min_value"
            )
        if value > MAX_TOKEN_LIMIT:
            raise InvalidRequest(
                f"'{field}' is too large ({value:.15g} tokens); send an integer from 1 to {MAX_TOKEN_LIMIT}",
                param=field,
                code="integer_above_max_value",
            )
        if isinstance(value, float):
            raise InvalidRequest(
                f"'{field}' must be an integer number of tokens, not the float {value!r}; send {int(value)}",
                param=field,
                code="invalid_type",
            )


def _json_kind(value: Any) -> str:
    return "boolean" if isinstance(value, bool) else "array" if isinstance(value, list) else "object"


def error_response(error: GatewayError, *, request_id: str, extra_headers: dict[str, str] | None = None) -> Response:
    """The OpenAI error envelope for ``error`` with its status and retry hints
    (:func:`error_headers`)."""
    headers = error_headers(error, request_id=request_id, extra_headers=extra_headers)
    return Response(content=error.body(), status_code=error.status, headers=headers, media_type="application/json")


def error_headers(error: GatewayError, *, request_id: str, extra_headers: dict[str, str] | None) -> dict[str, str]:
    """The headers of an error answer in any envelope: ``x-request-id``, the error's own
    (``retry-after`` when the upstream gave one), ``extra_headers``, and
    ``x-should-retry``, which the openai and anthropic SDKs read before their own status
    rules: true for 408/409/429/5xx, false otherwise."""
    headers = {"x-request-id": request_id, **error.headers}
    headers["x-should-retry"] = "true" if error.status in (408, 409, 429) or error.status >= 500 else "false"
    if extra_headers:
        headers.update(extra_headers)
    return headers


#: The disconnect watch starts this long after the work: most of a request's wait is the
#: upstream's (seconds), and a request answered sooner does without the watcher task
#: (its cost: docs/performance.md); a client that left is still noticed
#: within this time of starting to wait.
WATCH_AFTER_SECONDS = 0.02


async def until_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` (routing and the wait for the upstream's first token), cancelling
    it when the client disconnects (noticed at most :data:`WATCH_AFTER_SECONDS` after the
    wait began, then at once), so an abandoned request closes its upstream connection
    instead of holding it until a timeout.

    Call only after the body was read: from then on the ASGI ``receive`` channel
    carries nothing but ``http.disconnect``.

    Raises:
        ClientClosedRequest: the client went away first (499).
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    left = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal left
        while (await request.receive())["type"] != "http.disconnect":
            pass
        left = True
        task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER_SECONDS, start_watching)
    try:
        return await work
    except asyncio.CancelledError:
        if not left:
            raise
        task.uncancel()
        raise ClientClosedRequest("the client closed the connection before the answer began") from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
