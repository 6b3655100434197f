"""Anthropic Messages API routes, for Claude Code and the Anthropic SDKs.

``POST /v1/messages`` (streamed or not) is translated to chat completions
(:mod:`latgate.request.translate`), routed and forwarded like any chat completion, and the
answer translated back. ``POST /v1/messages/count_tokens`` answers
``{"input_tokens": N}`` with latgate's prompt estimate, contacting nothing.

Both accept what Claude Code sends: the ``?beta=true`` query, ``anthropic-version``
and ``anthropic-beta`` headers (read by nobody: latgate speaks one version and the
upstream never sees client headers), the gateway key as ``x-api-key`` or
``Authorization: Bearer`` (checked with ``[auth]``, before the body is read; the key's
policy routes requests that carry no ``X-Route-Policy``); both are served by
:func:`latgate.api.serve.serve` like every API. Errors use the Anthropic envelope
``{"type": "error", "error": {"type", "message"}}`` with the gateway error's status and
the same retry hints as the OpenAI routes (``x-should-retry``, ``retry-after``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response

from latgate.api.body import error_headers
from latgate.api.serve import Api, Envelope, Forward, Prepare
from latgate.forwarding.exchange import Exchange
from latgate.foundation.errors import GatewayError
from latgate.request.auth import Caller
from latgate.request.gateway import REFUSING_DEEP_NESTING, Gateway
from latgate.request.translate import (
    MessagesStream,
    anthropic_error_body,
    messages_to_chat,
    stop_sequences_of,
)
from latgate.routing.tokens import estimate_prompt_tokens


def _messages(
    gateway: Gateway, exchange: Exchange, body: dict[str, Any], headers: Mapping[str, str], caller: Caller | None
) -> Forward:
    """``POST /v1/messages``: the body as a chat completion, its answer translated back."""
    transform = MessagesStream(exchange=exchange, stop_sequences=stop_sequences_of(body))
    return Forward(body=messages_to_chat(body), path="/chat/completions", transform=transform)


def _count_tokens(
    gateway: Gateway, exchange: Exchange, body: dict[str, Any], headers: Mapping[str, str], caller: Caller | None
) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the estimate routing uses."""
    with REFUSING_DEEP_NESTING:
        tokens = estimate_prompt_tokens(messages_to_chat(body))
    return Response(
        orjson.dumps({"input_tokens": tokens}),
        media_type="application/json",
        headers={"x-request-id": exchange.request_id},
    )


def error_response(
    error: GatewayError, *, request_id: str, extra_headers: dict[str, str] | None = None
) -> Response:
    """``error`` in the Anthropic envelope, with its status and the retry hints of every
    envelope (:func:`latgate.api.body.error_headers`), its request id also as ``request-id``
    (the header the Anthropic SDKs read)."""
    headers = error_headers(error, request_id=request_id, extra_headers=extra_headers)
    headers["request-id"] = request_id
    body = anthropic_error_body(status=error.status, message=error.message, request_id=request_id)
    return Response(content=body, status_code=error.status, headers=headers, media_type="application/json")


ANTHROPIC_ENVELOPE = Envelope(render=error_response, schema="AnthropicError")


def _anthropic_api(
    name: str,
    prepare: Prepare,
    *,
    summary: str,
    request_schema: str,
    answer_schema: dict[str, Any] | None = None,
    token_limit_fields: tuple[str, ...] = (),
) -> Api:
    """An API at ``/v1{name}`` in the Anthropic envelope; streamed unless latgate answers it
    (``answer_schema``)."""
    return Api(
        name=name,
        paths=("/v1" + name,),
        prepare=prepare,
        summary=summary,
        request_schema=request_schema,
        envelope=ANTHROPIC_ENVELOPE,
        streams=answer_schema is None,
        answer_schema=answer_schema,
        token_limit_fields=token_limit_fields,
    )


MESSAGES = _anthropic_api(
    "/messages",
    _messages,
    summary="Anthropic Messages API, translated",
    request_schema="MessagesRequest",
    token_limit_fields=("max_tokens",),
)
COUNT_TOKENS = _anthropic_api(
    "/messages/count_tokens",
    _count_tokens,
    summary="Anthropic token count (latgate's estimate)",
    request_schema="CountTokensRequest",
    answer_schema={
        "type": "object",
        "required": ["input_tokens"],
        "properties": {"input_tokens": {"type": "integer"}},
    },
)
