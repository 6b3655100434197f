"""``POST /v1/responses`` (and ``/responses``): the OpenAI Responses API, the only wire API
of the Codex CLI, served by translating to chat completions.

One request: read the body -> :func:`~latgate.translate.responses_request.responses_to_chat`
-> ``Gateway.proxy(path="/chat/completions")`` with a
:class:`~latgate.translate.responses_stream.ResponsesStreamTransform` for the answer. The
chat body routes, falls back and is measured like any chat completion; with ``[auth]``
the key is checked before the body is read. Errors use the OpenAI envelope, which the
Responses API shares.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from latgate.api.body import error_response, read_json_object, until_client_leaves
from latgate.errors import GatewayError
from latgate.gateway import Gateway
from latgate.translate.responses_request import responses_to_chat
from latgate.translate.responses_stream import ResponsesStreamTransform


async def create_response(request: Request) -> Any:
    """Serve one Responses API request; never raises (errors become envelopes)."""
    gateway: Gateway = request.app.state.gateway
    exchange = gateway.new_exchange(request, path="/responses")
    try:
        caller = gateway.authenticate(request.headers)
        body = await read_json_object(request, max_bytes=gateway.config.server.max_body_bytes)
        translation = responses_to_chat(body)
        transform = ResponsesStreamTransform(echo=translation.echo, namespaced=translation.namespaced)
        forwarded = gateway.proxy(
            exchange,
            body=translation.chat_body,
            headers=request.headers,
            path="/chat/completions",
            transform=transform,
            caller=caller,
        )
        return await until_client_leaves(request, forwarded)
    except GatewayError as error:
        gateway.fail(exchange, error)
        return error_response(
            error, request_id=exchange.request_id, extra_headers=gateway.route_headers(exchange)
        )


def hot_routes() -> dict[str, Any]:
    """Path -> handler for the Responses POSTs (dispatched without the framework's routing)."""
    return {"/v1/responses": create_response, "/responses": create_response}
