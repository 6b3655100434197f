"""The OpenAI APIs latgate proxies as sent (chat completions, completions, embeddings)
and the model list.

Each path is served with and without the ``/v1`` prefix, since clients differ on
whether their base URL includes it. A body must carry the API's required field
(``messages``, ``prompt``, ``input``; 400 naming it otherwise); everything else passes
through to the provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from latgate.api.body import error_response, require
from latgate.api.serve import Api, Forward, Prepare
from latgate.forwarding.exchange import Exchange
from latgate.foundation.errors import GatewayError
from latgate.request.auth import Caller
from latgate.request.gateway import Gateway, request_id
from latgate.routing.headers import refuse_duplicate_headers

PREFIXES = ("/v1", "")


def _requiring(path: str, field: str, kind: type | tuple[type, ...], what: str) -> Prepare:
    """A ``prepare`` that forwards the body to ``path`` once ``body[field]`` is a ``kind``."""

    def prepare(
        gateway: Gateway, exchange: Exchange, body: dict[str, Any], headers: Mapping[str, str], caller: Caller | None
    ) -> Forward:
        require(body, field, kind, what=what)
        return Forward(body=body, path=path)

    return prepare


def _openai_api(
    path: str,
    prepare: Prepare,
    *,
    summary: str,
    request_schema: str,
    streams: bool = True,
    token_limit_fields: tuple[str, ...] = (),
) -> Api:
    return Api(
        name=path,
        paths=tuple(prefix + path for prefix in PREFIXES),
        prepare=prepare,
        summary=summary,
        request_schema=request_schema,
        streams=streams,
        token_limit_fields=token_limit_fields,
    )


CHAT_COMPLETIONS = _openai_api(
    "/chat/completions",
    _requiring("/chat/completions", "messages", list, "an array of messages"),
    summary="Chat completion, routed",
    request_schema="ChatCompletionRequest",
    token_limit_fields=("max_completion_tokens", "max_tokens"),
)
COMPLETIONS = _openai_api(
    "/completions",
    _requiring("/completions", "prompt", (str, list), "a string or an array"),
    summary="Text completion, routed",
    request_schema="CompletionRequest",
    token_limit_fields=("max_tokens",),
)
EMBEDDINGS = _openai_api(
    "/embeddings",
    _requiring("/embeddings", "input", (str, list), "a string or an array"),
    summary="Embeddings, routed",
    request_schema="EmbeddingRequest",
    streams=False,
)


def _model_caller(request: Request) -> Caller | None:
    """The key of a model-list request (``None`` without ``[auth]``: the app let only
    a valid key through); a header latgate acts on sent twice is refused (400)."""
    refuse_duplicate_headers(request.scope["headers"])
    guard = request.app.state.gateway.guard
    return None if guard is None else guard.authenticate(request.headers)


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: see :meth:`Gateway.models` (only the models the key may use)."""
    try:
        caller = _model_caller(request)
    except GatewayError as error:
        return error_response(error, request_id=request_id(None))
    return request.app.state.gateway.models(caller)


async def get_model(request: Request) -> Response:
    """``GET /v1/models/{id}``: see :meth:`Gateway.model` (404 for a model the key may not use)."""
    try:
        return request.app.state.gateway.model(request.path_params["model_id"], _model_caller(request))
    except GatewayError as error:
        return error_response(error, request_id=request_id(None))
