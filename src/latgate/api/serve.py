"""The one path every proxied API takes, driven by a small description of the API.

An :class:`Api` says what differs between APIs: how its body is checked and turned into
what goes upstream (``prepare``: the OpenAI body as sent, a translated chat body with a
transform for the answer, or an answer latgate gives itself), which error envelope its
clients read, where it is routed and how it is documented. :func:`serve` owns the rest,
the same for every API, in this order:

1. the request's :class:`~latgate.forwarding.exchange.Exchange` (request id, span);
2. cheap checks first (with ``[auth]``): the key, then its request rate, before the
   body is read; the model allow-list once the body is parsed, before it is counted;
3. the body, read within ``[server] max_body_bytes`` (413 beyond);
4. ``api.prepare``, then ``Gateway.proxy`` (routing, token limits, forwarding, the
   stream relay) while watching for the client leaving (499);
5. exactly one ``finish`` for every outcome: answered, refused (the API's envelope),
   the client gone or timed out while sending its body (499 / 408, as nginx records
   them), cut at the drain deadline, or a bug (500, one log line, no traceback).

The route table (:mod:`latgate.api.routes`) lists every API once; a new API is a new
description there, never a copied handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from latgate.api.body import check_token_limits, error_response, read_json_object, until_client_leaves
from latgate.forwarding.exchange import CLIENT_CLOSED, Exchange, is_drain_cut
from latgate.forwarding.transform import ResponseTransform
from latgate.foundation.errors import GatewayError, RateLimited
from latgate.foundation.scope_keys import TIMEOUT_SCOPE_KEY
from latgate.request.auth import AuthGuard, Caller
from latgate.request.gateway import MAX_LOGGED_MODEL_CHARS, REFUSING_DEEP_NESTING, Gateway, drain_cut_error
from latgate.routing.decision import RouteDecision
from latgate.routing.headers import refuse_duplicate_headers

log = logging.getLogger("latgate")

#: The status recorded for a client that timed out sending its body (``body_timeout``).
REQUEST_TIMEOUT = 408


@dataclass(slots=True)
class Forward:
    """What goes upstream for one request: an OpenAI-shaped ``body`` for the upstream
    ``path``, the ``transform`` its answer needs (``None``: relayed as sent) and, when
    ``prepare`` already routed it, the ``decision``."""

    body: dict[str, Any]
    path: str
    transform: ResponseTransform | None = None
    decision: RouteDecision | None = None


class Prepare(Protocol):
    """An API's check and translation of a parsed body.

    Returns:
        a :class:`Forward`, or a :class:`Response` latgate answers itself.

    Raises:
        GatewayError: the body is refused (rendered in the API's envelope).
    """

    def __call__(
        self,
        gateway: Gateway,
        exchange: Exchange,
        body: dict[str, Any],
        headers: Mapping[str, str],
        caller: Caller | None,
    ) -> Forward | Response: ...


@dataclass(frozen=True, slots=True)
class Envelope:
    """An error envelope: ``render(error, request_id=..., extra_headers=...)`` -> the
    response, and ``schema``, the OpenAPI component describing it."""

    render: Callable[..., Response]
    schema: str


#: OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (the Responses API's too).
OPENAI_ENVELOPE = Envelope(render=error_response, schema="ErrorResponse")


@dataclass(frozen=True, slots=True)
class Api:
    """One proxied API (always a ``POST``).

    Attributes:
        name: the path it is recorded under (access line ``path``, span route after
            ``/v1``), e.g. ``/chat/completions``, ``/messages``.
        paths: the routes it is served at, e.g. ``("/v1/chat/completions", "/chat/completions")``.
        prepare: checks the parsed body and says what goes upstream (:class:`Prepare`).
        envelope: how its errors are rendered (:data:`OPENAI_ENVELOPE` by default).
        summary: one line for the OpenAPI document.
        request_schema: the OpenAPI component of its request body.
        streams: whether it may answer with an SSE stream.
        answer_schema: the JSON schema of its 200 answer (``None``: the provider's, relayed).
        token_limit_fields: its body's token-limit fields (``max_tokens``...), refused
            with a 400 saying what is wrong when no engine could take them
            (:func:`~latgate.api.body.check_token_limits`), before ``prepare``.
    """

    name: str
    paths: tuple[str, ...]
    prepare: Prepare
    summary: str
    request_schema: str
    envelope: Envelope = OPENAI_ENVELOPE
    streams: bool = True
    answer_schema: dict[str, Any] | None = None
    token_limit_fields: tuple[str, ...] = ()

    async def endpoint(self, request: Request) -> Response:
        """A framework endpoint for the API (the hot dispatch calls :func:`serve` directly)."""
        return await serve(request.app.state.gateway, self, request)


async def serve(gateway: Gateway, api: Api, request: Request) -> Any:
    """Serve one request of ``api``: an ASGI response (a stream relay, a JSON answer or
    an error envelope). Never raises except for a cancellation that is not latgate's."""
    exchange = gateway.new_exchange(request, path=api.name)
    guard = gateway.guard
    caller: Caller | None = None  # authenticated only when guard is not None
    try:
        refuse_duplicate_headers(request.scope["headers"])
        if guard is not None:
            caller = guard.authenticate(request.headers)
            if caller.rpm is not None:
                guard.check_request_rate(caller)
        body = await read_json_object(request, max_bytes=gateway.config.server.max_body_bytes)
        model = body.get("model")
        if isinstance(model, str):  # named in the access line even when it is refused
            exchange.public_model = model[:MAX_LOGGED_MODEL_CHARS]
            if guard is not None and caller is not None:
                guard.check_model(caller, model)
        check_token_limits(body, api.token_limit_fields)
        with REFUSING_DEEP_NESTING:  # a translation encodes parts of the body (tool inputs) as JSON text
            work = api.prepare(gateway, exchange, body, request.headers, caller)
        if isinstance(work, Response):  # answered by latgate itself
            if guard is not None and caller is not None and caller.rpm is not None:
                exchange.limits_charged = True
                await guard.admit_request(caller)
            exchange.status = work.status_code
            gateway.recorder.finish(exchange)
            return work
        forwarded = gateway.proxy(
            exchange,
            body=work.body,
            headers=request.headers,
            path=work.path,
            transform=work.transform,
            caller=caller,
            decision=work.decision,
        )
        return await until_client_leaves(request, forwarded)
    except GatewayError as error:
        if caller is not None and caller.models is not None:
            error = gateway.scoped_error(error, caller, model=exchange.public_model, route_to=request.headers.get("x-route-to"))
        if guard is not None and caller is not None and caller.rpm is not None and not exchange.limits_charged:
            await charge_refused_request(guard, caller, error)
        return refuse(gateway, api, exchange, error)
    except asyncio.CancelledError as exc:
        if not is_drain_cut(exc):
            raise
        task = asyncio.current_task()
        assert task is not None  # serve() runs in the server's request task
        task.uncancel()
        return refuse(gateway, api, exchange, drain_cut_error())
    except ClientDisconnect:  # gone (or timed out) while sending its body: nothing went upstream
        timed_out = request.scope.get(TIMEOUT_SCOPE_KEY)
        exchange.status = REQUEST_TIMEOUT if timed_out else CLIENT_CLOSED
        exchange.error_kind = timed_out or "client_closed"
        gateway.recorder.finish(exchange)
        return Response(status_code=exchange.status)
    except Exception as exc:  # noqa: BLE001  # a bug: a 500 envelope and one line, never a traceback
        log.error("internal error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
        return refuse(gateway, api, exchange, GatewayError("internal error in latgate", code="internal_error"))


async def charge_refused_request(guard: AuthGuard, caller: Caller, error: GatewayError) -> None:
    """Count a request refused before its charge (a bad body, a model not allowed)
    against its key's RPM, as every request counts; a 429 took nothing and takes nothing.
    The refusal stands whatever the store says."""
    if not isinstance(error, RateLimited):
        with contextlib.suppress(GatewayError):
            await guard.admit_request(caller)


def refuse(gateway: Gateway, api: Api, exchange: Exchange, error: GatewayError) -> Response:
    """Record a request that ended in ``error`` and render it in ``api``'s envelope."""
    headers = gateway.record_failure(exchange, error)
    return api.envelope.render(error, request_id=exchange.request_id, extra_headers=headers)
