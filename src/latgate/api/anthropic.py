"""Anthropic Messages API routes, for Claude Code and the Anthropic SDKs.

``POST /v1/messages`` (streamed or not) is translated to chat completions
(:mod:`latgate.translate`), routed and forwarded like any chat completion, and the
answer translated back. ``POST /v1/messages/count_tokens`` answers
``{"input_tokens": N}`` with latgate's prompt estimate, contacting nothing.

Both accept what Claude Code sends: the ``?beta=true`` query, ``anthropic-version``
and ``anthropic-beta`` headers (read by nobody: latgate speaks one version and the
upstream never sees client headers), the gateway key as ``x-api-key`` or
``Authorization: Bearer`` (checked with ``[auth]``, before the body is read; the key's
policy routes requests that carry no ``X-Route-Policy``). Errors use the Anthropic envelope
``{"type": "error", "error": {"type", "message"}}`` with the gateway error's status and
the same retry hints as the OpenAI routes (``x-should-retry``, ``retry-after``).
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from latgate.api.body import read_json_object, until_client_leaves
from latgate.errors import GatewayError, InvalidRequest
from latgate.gateway import Gateway
from latgate.routing.tokens import estimate_prompt_tokens
from latgate.translate import MessagesStream, anthropic_error_body, messages_to_chat, stop_sequences_of

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def messages(request: Request) -> object:
    """``POST /v1/messages``: an ASGI response (a stream relay or a JSON message); never raises."""
    gateway = _gateway(request)
    exchange = gateway.new_exchange(request, path="/messages")
    try:
        caller = gateway.authenticate(request.headers)
        body = await read_json_object(request, max_bytes=gateway.config.server.max_body_bytes)
        chat = messages_to_chat(body)
        transform = MessagesStream(exchange=exchange, stop_sequences=stop_sequences_of(body))
        forwarded = gateway.proxy(
            exchange,
            body=chat,
            headers=request.headers,
            path="/chat/completions",
            transform=transform,
            caller=caller,
        )
        return await until_client_leaves(request, forwarded)
    except GatewayError as error:
        return error_response(
            error, request_id=exchange.request_id, extra_headers=gateway.record_failure(exchange, error)
        )


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the estimate routing uses."""
    gateway = _gateway(request)
    request_id = gateway.new_exchange(request, path="/messages/count_tokens").request_id
    try:
        gateway.authenticate(request.headers)
        body = await read_json_object(request, max_bytes=gateway.config.server.max_body_bytes)
        try:
            tokens = estimate_prompt_tokens(messages_to_chat(body))
        except (RecursionError, orjson.JSONEncodeError):  # the client's nesting defeats the estimate
            raise InvalidRequest("request body is nested too deeply", code="nesting_too_deep") from None
    except GatewayError as error:
        return error_response(error, request_id=request_id)
    return Response(
        orjson.dumps({"input_tokens": tokens}),
        media_type="application/json",
        headers={"x-request-id": request_id},
    )


def error_response(
    error: GatewayError, *, request_id: str, extra_headers: dict[str, str] | None = None
) -> Response:
    """``error`` in the Anthropic envelope, with its status and retry hints.

    ``x-should-retry`` (read by the Anthropic SDKs as by the OpenAI ones) is true for
    408/409/429/5xx, as on the OpenAI routes (:func:`latgate.api.body.error_response`);
    ``retry-after`` comes with the error when the upstream gave one.
    """
    headers = {"x-request-id": request_id, "request-id": request_id, **error.headers}
    retry = error.status in (408, 409, 429) or error.status >= 500
    headers["x-should-retry"] = "true" if retry else "false"
    if extra_headers:
        headers.update(extra_headers)
    body = anthropic_error_body(status=error.status, message=error.message, request_id=request_id)
    return Response(content=body, status_code=error.status, headers=headers, media_type="application/json")


def hot_routes() -> dict[str, object]:
    """Path -> handler, dispatched without the framework's routing (see :class:`latgate.app.LatgateApp`)."""
    return {MESSAGES_PATH: messages, COUNT_TOKENS_PATH: count_tokens}


def routes() -> list[Route]:
    """The same routes for the framework (so other methods get a 405)."""
    return [
        Route(MESSAGES_PATH, messages, methods=["POST"]),
        Route(COUNT_TOKENS_PATH, count_tokens, methods=["POST"]),
    ]
