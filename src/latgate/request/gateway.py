"""The gateway's run-time core: one request from a prepared body to ASGI response.

Every API's request enters through :func:`latgate.api.serve.serve` (key, request rate,
body, the API's own check), which hands ``Gateway.proxy`` what goes upstream:
``Router.decide`` -> key allow-list and token limits (with ``[auth]`` only) ->
``Forwarder.forward`` (retries, fallback, stream relay) -> metrics, access log, span and
``/ui`` ring via the app's :class:`~latgate.forwarding.recorder.Recorder`, which receives the
request's finished :class:`Exchange`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from latgate.forwarding.exchange import DRAIN_CUT_STATUS, Exchange
from latgate.forwarding.forward import Forwarder
from latgate.forwarding.recorder import Recorder
from latgate.forwarding.transform import ResponseTransform
from latgate.forwarding.wire import check_stream_options, nesting_too_deep
from latgate.foundation.config.schema import Config
from latgate.foundation.errors import GatewayError, InvalidRequest, NotFound
from latgate.foundation.metrics import Metrics
from latgate.foundation.scope_keys import REQUEST_ID_SCOPE_KEY
from latgate.live.providers import ProviderPool
from latgate.live.providers.carry import carry_live_state
from latgate.live.providers.catalog import public_model_object
from latgate.live.store import HealthSync, RedisStore, SharedStore, open_store
from latgate.request.auth import AuthGuard, Caller, forward_within_limits
from latgate.routing.decision import RouteDecision, Router
from latgate.routing.priority import effective_priority, priority_header
from latgate.routing.sessions import SessionMap
from latgate.transport.upstream import UpstreamClient

log = logging.getLogger("latgate")

MAX_REQUEST_ID_LENGTH = 128


MAX_LOGGED_MODEL_CHARS = 128
"""How much of a requested model name that routing refused the access line keeps."""


class Gateway:
    """Everything one app instance needs at run time (no globals).

    Args:
        config: the resolved config.
        client: the pooled upstream client.
        metrics: this app's metrics.
        env: where provider keys are read from (``os.environ`` by default).
        store: the shared store of rate-limit counters, kept across reloads (by
            default a new one for ``config.state``; see :class:`latgate.live.store.SharedStores`).
        recorder: where finished requests go (metrics, access log, and the span and
            ``/ui`` ring when it has them); the app's, which outlives reloads (by
            default one with ``metrics`` and the access log only).
        sessions: where client sessions' placements are kept (:mod:`latgate.live.store.sessions`;
            in process by default).
        previous: the gateway this one replaces on a reload: its providers' live state
            is carried over (:func:`latgate.live.providers.carry.carry_live_state`).

    Attributes (with ``[auth]`` / Redis only, else ``None``): ``guard`` checks keys
    (:mod:`latgate.request.auth`); ``health_sync`` shares endpoint health with other replicas.
    """

    def __init__(
        self,
        *,
        config: Config,
        client: UpstreamClient,
        metrics: Metrics,
        env: Mapping[str, str] | None = None,
        store: SharedStore | None = None,
        recorder: Recorder | None = None,
        previous: Gateway | None = None,
        sessions: SessionMap | None = None,
    ) -> None:
        self.config = config
        self.recorder = Recorder(metrics=metrics) if recorder is None else recorder
        self.metrics = metrics
        self.client = client
        self.router = Router(config)
        self.pool = ProviderPool(config, metrics=metrics, env=env, sessions=sessions)
        if previous is not None:  # a reload: before anything else sees the new pool
            carry_live_state(self.pool, previous.pool, metrics=metrics)
        self.forwarder = Forwarder(config=config, pool=self.pool, client=client, metrics=metrics, recorder=self.recorder)
        if previous is not None:  # the gateway queue's counters and what it learnt
            self.forwarder.admission.carry_from(previous.forwarder.admission)
        self.store = open_store(config.state) if store is None else store
        self.guard: AuthGuard | None = None
        if config.auth is not None:
            self.guard = AuthGuard(config=config.auth, store=self.store, fail_open=config.state.fail_open)
        self.health_sync: HealthSync | None = None
        if isinstance(self.store, RedisStore):
            self.health_sync = HealthSync(store=self.store, pool=self.pool, metrics=metrics)
        self.models_body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "latgate"} for name in config.public_models()
                ],
            }
        )

    # long: the request path's steps in order (stream flag, decision, priority, auth limits, forward); most of
    # its length is the docstring and the limits' call, and it runs once per request
    async def proxy(
        self,
        exchange: Exchange,
        *,
        body: dict[str, Any],
        headers: Mapping[str, str],
        path: str,
        transform: ResponseTransform | None = None,
        caller: Caller | None = None,
        decision: RouteDecision | None = None,
    ) -> Any:
        """Route and forward an OpenAI-shaped ``body`` (translated APIs pass a
        ``transform`` for the answer). ``decision``: one the API already made with
        :meth:`decide` (the Responses API, which picks the upstream path from its
        candidates); else it is made here.

        ``caller``: the key :func:`latgate.api.serve.serve` authenticated and charged
        its request unit (with ``[auth]``; ``None`` without): its policy is the default
        route policy, its allow-list and token limits apply here.

        Returns:
            an ASGI response.

        Raises:
            GatewayError: bad request, no route, or every candidate failed; with
                ``[auth]`` also 403 and 429 (see :mod:`latgate.request.auth`). The caller
                records it (:meth:`record_failure`) and renders it in its API's envelope.
        """
        stream = body.get("stream")
        if stream is None:  # absent, or null (the openai SDK's stream=None): not streamed
            stream = False
            if "stream" in body:
                body["stream"] = False
        if not isinstance(stream, bool):
            raise InvalidRequest("'stream' must be a boolean", param="stream", code="invalid_type")
        check_stream_options(body.get("stream_options"))
        exchange.stream = stream and path != "/embeddings"
        guard = self.guard
        if decision is None:
            decision = self.decide(body, headers, key_policy=None if caller is None else caller.policy)
        exchange.public_model = decision.public_model
        exchange.prompt_tokens = exchange.routed_prompt_tokens = decision.prompt_tokens
        exchange.priority, exchange.tenant = self._priority(decision, headers, caller, exchange.tenant)
        exchange.expected_completion = self.forwarder.selector.expected_completion(
            body, priority=exchange.priority, tenant=exchange.tenant
        )  # once: the token limits, the gateway queue and the plan read it
        if "model" not in body:
            body["model"] = decision.public_model
        if caller is not None:
            assert guard is not None  # a caller is authenticated only with [auth] on
            guard.check_model(caller, decision.public_model)
            if caller.limited:
                exchange.limits_charged = True
                model = self.config.models.get(decision.public_model)
                reservation = await guard.admit(
                    caller,
                    prompt_tokens=decision.prompt_tokens,
                    completion_tokens=exchange.expected_completion[0],
                    context_tokens=None if model is None else model.max_context_tokens,
                )
                if reservation is not None:
                    return await forward_within_limits(
                        reservation,
                        exchange,
                        lambda: self.forwarder.forward(
                            exchange=exchange, decision=decision, body=body, path=path, transform=transform
                        ),
                    )
        return await self.forwarder.forward(exchange=exchange, decision=decision, body=body, path=path, transform=transform)

    def _priority(
        self, decision: RouteDecision, headers: Mapping[str, str], caller: Caller | None, address: str
    ) -> tuple[int, str]:
        """The request's priority class and fair-share tenant for the gateway queue
        (:mod:`latgate.routing.priority`): its key's name; without a key, ``address``
        (the client's network address, :meth:`new_exchange`), never anything the
        client sends (a session id is the client's to mint: a fresh one per request
        would be a fresh share each time).

        Raises:
            InvalidRequest: a malformed ``X-Latgate-Priority``.
        """
        claimed = priority_header(headers.get("x-latgate-priority"))
        policy = self.config.routing.policies.get(decision.policy) if decision.policy else None
        priority = effective_priority(
            claimed=claimed,
            policy=policy.priority if policy is not None else None,
            ceiling=caller.priority if caller is not None else None,
            has_budget=decision.budget_ms is not None,
            latency_sensitive=decision.latency_sensitive,
        )
        return priority, caller.name if caller is not None else address

    def decide(self, body: dict[str, Any], headers: Mapping[str, str], *, key_policy: str | None = None) -> RouteDecision:
        """``Router.decide`` for a client's body (see :meth:`Router.decide`).

        Raises:
            InvalidRequest: as ``Router.decide``, and code ``nesting_too_deep`` when the
                body is nested too deeply to estimate its tokens.
            NotFound: no provider serves the model.
        """
        with REFUSING_DEEP_NESTING:
            return self.router.decide(body, headers, key_policy=key_policy)

    def new_exchange(self, request: Request, *, path: str) -> Exchange:
        """A request record started now, with the client's or a new request id, the path
        as the client sent it (``/v1/chat/completions``: what operators grep the access
        log for) and, with tracing on, its span (route ``path``, the API's name) started
        from the client's ``traceparent``."""
        exchange = Exchange(
            request_id=request_id(request.headers.get("x-request-id")),
            received_at=time.perf_counter(),
            path=request.scope["path"],
            stream=False,
        )
        exchange.tenant = client_tenant(request.scope.get("client"))  # the fair share of a request without a key
        request.scope[REQUEST_ID_SCOPE_KEY] = exchange.request_id  # a stalled body's 408 names it too
        tracing = self.recorder.tracing
        if tracing is not None:
            tracing.begin(exchange, path=path, headers=request.headers)
        return exchange

    def record_failure(self, exchange: Exchange, error: GatewayError) -> dict[str, str]:
        """Record a request that ended in ``error`` (metrics, access log); returns the
        response headers naming where it went, when it went anywhere
        (``X-Latgate-Provider``, ``X-Latgate-Route-Reason``), for any envelope."""
        exchange.fail(error)
        if error.cause is not None:
            exchange.cause = error.cause
        self.recorder.finish(exchange)
        if not exchange.provider:
            return {}
        return {"x-latgate-provider": exchange.provider, "x-latgate-route-reason": exchange.reason}

    def record_refusal(self, *, status: int, kind: str, path: str) -> str:
        """Record a connection the server refused before any request reached the app
        (:mod:`latgate.app.httplimits`: a head timeout, the connection cap, a malformed or
        oversized head): a metric (provider ``none``) and an access line. Returns the
        access line's request id (the refusal's ``x-request-id``)."""
        exchange = Exchange(request_id=request_id(None), received_at=time.perf_counter(), path=path, stream=False)
        exchange.status, exchange.error_kind = status, kind
        self.recorder.finish(exchange, listed=False)  # not a request: not on /ui
        return exchange.request_id

    def models(self, caller: Caller | None = None) -> Response:
        """``GET /v1/models``: the union of providers' models and aliases (OpenAI list
        shape), each the engine's own model object where an engine reported one
        (``max_model_len``, ``created``... kept: :mod:`latgate.live.providers.catalog`);
        with a ``caller`` whose key has a model allow-list, only the models it may use."""
        catalogs = self._catalogs()
        scope = caller if caller is not None and caller.models is not None else None
        if not catalogs and scope is None:
            return Response(self.models_body, media_type="application/json")
        names = self.config.public_models()
        if scope is not None:
            names = [name for name in names if scope.may_use(name)]
        data = [self._model_object(name, catalogs) for name in names]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")

    def model(self, model_id: str, caller: Caller | None = None) -> Response:
        """``GET /v1/models/{id}``: one model object.

        Raises:
            NotFound: ``model_not_found``, also for a model the ``caller``'s key may not
                use (it is not shown to exist; the message lists only what it may use).
        """
        usable = caller is None or caller.may_use(model_id)
        if usable and (model_id in self.config.public_models() or self.router.serves(model_id)):
            return Response(orjson.dumps(self._model_object(model_id, self._catalogs())), media_type="application/json")
        error: GatewayError = NotFound(self.router.not_found_message(model_id), param="model", code="model_not_found")
        if caller is not None and caller.models is not None:
            error = self.scoped_error(error, caller, model=model_id, route_to=None)
        raise error

    def scoped_error(self, error: GatewayError, caller: Caller, *, model: str | None, route_to: str | None) -> GatewayError:
        """``error`` as a key with a model allow-list may see it: a 404
        ``model_not_found`` lists only the models it may use, an ``X-Route-To`` 400
        only the providers serving them (``model``: the name asked for; ``route_to``:
        the header's value). Any other error as it is."""
        usable = [name for name in self.config.public_models() if caller.may_use(name)]
        if error.code == "model_not_found":
            shown = "none" if not usable else ", ".join(usable)
            return NotFound(f"model {model!r} is not served here; models this key may use: {shown}", param="model", code="model_not_found")
        if error.param == "X-Route-To" and route_to is not None:
            providers = [name for name in self.config.providers if any(name in self.router.serving_providers(m) for m in usable)]
            return InvalidRequest(
                f"X-Route-To names unknown provider {route_to.strip()[:64]!r}; providers this key may use: {', '.join(providers) or 'none'}",
                param="X-Route-To", code="invalid_header_value",
            )
        return error


    def _catalogs(self) -> list[dict[str, dict[str, Any]]]:
        """The model lists the engines reported, in provider and endpoint order."""
        return [ep.catalog for runtime in self.pool.providers.values() for ep in runtime.endpoints if ep.catalog]

    def _model_object(self, public: str, catalogs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
        served = [public, *self.config.aliases.get(public, {}).values()]
        return public_model_object(public, served, catalogs)


class _RefusingDeepNesting:
    """``with REFUSING_DEEP_NESTING:`` turns the ``RecursionError`` (or orjson's
    encode error) of a body nested too deeply to count or translate into ``InvalidRequest`` 400,
    code ``nesting_too_deep``."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if kind is not None and issubclass(kind, (RecursionError, orjson.JSONEncodeError)):
            raise nesting_too_deep() from None


REFUSING_DEEP_NESTING = _RefusingDeepNesting()


def drain_cut_error() -> GatewayError:
    """The answer to a request cut at the drain deadline before its answer began."""
    return GatewayError(
        "latgate is shutting down: the drain timeout passed before the answer began; retry",
        status=DRAIN_CUT_STATUS,
        code="drain_timeout",
    )


def request_id(given: str | None) -> str:
    """The client's ``X-Request-Id`` when it is short and printable, else a new one
    (128 random bits as 32 hex digits, like ``uuid4().hex`` without building a UUID;
    ``os.urandom`` leaves the ``random`` module's state alone)."""
    if given and len(given) <= MAX_REQUEST_ID_LENGTH and given.isascii() and given.isprintable():
        return given
    return os.urandom(16).hex()


def client_tenant(client: Any) -> str:
    """The fair-share tenant of a request without a key: its peer's address
    (``"addr:HOST"`` from the ASGI scope's ``client``), ``""`` when unknown. The port is
    left out: a client opens connections at will, not addresses."""
    if isinstance(client, (tuple, list)) and client and isinstance(client[0], str):
        return f"addr:{client[0]}"
    return ""
