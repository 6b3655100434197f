"""``POST /v1/responses`` (and ``/responses``): the OpenAI Responses API, the only wire API
of the Codex CLI.

One request: read the body -> :func:`~latgate.request.translate.responses_request.responses_to_chat`
(validation, and the chat body routing estimates the prompt from) -> ``Gateway.decide``.
Then one of two paths:

- pass-through: when every candidate of the decision (primary, fallbacks, overflow)
  serves the Responses API itself (``[providers.NAME] responses_api = true``), the
  client's own body goes to the provider's ``/responses`` (model rewritten, the
  provider's ``extra_body`` applied) and the answer streams back byte for byte, timed
  and counted by the SSE tap like any stream;
- translation: otherwise the chat body goes to ``/chat/completions`` with a
  :class:`~latgate.request.translate.responses_stream.ResponsesStreamTransform` for the answer.

Either way the request routes, falls back and is measured like any chat completion,
served by :func:`latgate.api.serve.serve` like every API (with ``[auth]`` the key is
checked before the body is read). Errors use the OpenAI
envelope, which the Responses API shares. Fields that need stored state (``store:
true``, ``previous_response_id``...) are refused on both paths: a later turn may be
routed to another provider or endpoint, which would not have it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latgate.api.serve import Api, Forward
from latgate.forwarding.exchange import Exchange
from latgate.foundation.config.schema import ProviderConfig
from latgate.request.auth import Caller
from latgate.request.gateway import Gateway
from latgate.request.translate.responses_request import responses_to_chat
from latgate.request.translate.responses_stream import ResponsesStreamTransform
from latgate.routing.decision import RouteDecision


def _create_response(
    gateway: Gateway, exchange: Exchange, body: dict[str, Any], headers: Mapping[str, str], caller: Caller | None
) -> Forward:
    """One Responses API request: routed on its chat translation, then passed through
    or translated (see the module docstring)."""
    translation = responses_to_chat(body)
    decision = gateway.decide(translation.chat_body, headers, key_policy=None if caller is None else caller.policy)
    if serves_responses(gateway.config.providers, decision):
        return Forward(body=body, path="/responses", decision=decision)
    transform = ResponsesStreamTransform(echo=translation.echo, namespaced=translation.namespaced, exchange=exchange)
    return Forward(body=translation.chat_body, path="/chat/completions", transform=transform, decision=decision)


def serves_responses(providers: Mapping[str, ProviderConfig], decision: RouteDecision) -> bool:
    """True when every provider the request may go to (candidates and overflow) has
    ``responses_api = true``, so the client's Responses body can pass through."""
    return all(providers[target.provider].responses_api for target in decision.candidates) and all(
        providers[target.provider].responses_api for target in decision.overflow
    )


RESPONSES = Api(
    name="/responses",
    paths=("/v1/responses", "/responses"),
    prepare=_create_response,
    summary="OpenAI Responses API, translated",
    request_schema="ResponsesRequest",
    token_limit_fields=("max_output_tokens",),
)
