"""``POST /v1/responses`` (and ``/responses``): the OpenAI Responses API, the only wire API
of the Codex CLI.

One request: read the body -> :func:`~latgate.translate.responses_request.responses_to_chat`
(validation, and the chat body routing estimates the prompt from) -> ``Gateway.decide``.
Then one of two paths:

- pass-through: when every candidate of the decision (primary, fallbacks, overflow)
  serves the Responses API itself (``[providers.NAME] responses_api = true``), the
  client's own body goes to the provider's ``/responses`` (model rewritten, the
  provider's ``extra_body`` applied) and the answer streams back byte for byte, timed
  and counted by the SSE tap like any stream;
- translation: otherwise the chat body goes to ``/chat/completions`` with a
  :class:`~latgate.translate.responses_stream.ResponsesStreamTransform` for the answer.

Either way the request routes, falls back and is measured like any chat completion;
with ``[auth]`` the key is checked before the body is read. Errors use the OpenAI
envelope, which the Responses API shares. Fields that need stored state (``store:
true``, ``previous_response_id``...) are refused on both paths: a later turn may be
routed to another provider or endpoint, which would not have it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from latgate.api.body import read_json_object, until_client_leaves
from latgate.config.schema import ProviderConfig
from latgate.errors import GatewayError
from latgate.gateway import Gateway
from latgate.routing.decision import RouteDecision
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
        decision = gateway.decide(
            translation.chat_body, request.headers, key_policy=None if caller is None else caller.policy
        )
        if serves_responses(gateway.config.providers, decision):
            forwarded = gateway.proxy(
                exchange,
                body=body,
                headers=request.headers,
                path="/responses",
                caller=caller,
                decision=decision,
            )
        else:
            transform = ResponsesStreamTransform(echo=translation.echo, namespaced=translation.namespaced)
            forwarded = gateway.proxy(
                exchange,
                body=translation.chat_body,
                headers=request.headers,
                path="/chat/completions",
                transform=transform,
                caller=caller,
                decision=decision,
            )
        return await until_client_leaves(request, forwarded)
    except GatewayError as error:
        return gateway.fail(exchange, error)


def serves_responses(providers: Mapping[str, ProviderConfig], decision: RouteDecision) -> bool:
    """True when every provider the request may go to (candidates and overflow) has
    ``responses_api = true``, so the client's Responses body can pass through."""
    return all(providers[target.provider].responses_api for target in decision.candidates) and all(
        providers[target.provider].responses_api for target in decision.overflow
    )


def hot_routes() -> dict[str, Any]:
    """Path -> handler for the Responses POSTs (dispatched without the framework's routing)."""
    return {"/v1/responses": create_response, "/responses": create_response}
