"""``create_app``: builds one gateway app from a config. No singletons, no import-time
state, so tests run many configs in one process.

One request: the route table (``api/routes.py``) -> ``serve`` (``api/serve.py``: key,
request rate, body, the API's ``prepare``) -> ``Gateway.proxy`` (``request/gateway.py``) ->
``Router.decide`` (``routing/decision.py``) -> ``Forwarder.forward``
(``forwarding/forward.py``: retries, fallback, first-token deadline) -> ``StreamRelay``
(``forwarding/relay.py``, SSE tap in ``forwarding/sse.py``) -> the finished record
(``forwarding/exchange.py``) to the app's recorder (``forwarding/recorder.py``: metrics, access
log, span, ``/ui`` ring).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, get_args
from urllib.parse import quote

import orjson
from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from latgate import __version__
from latgate.api import openapi_doc
from latgate.api.body import ProxyRequest, error_response
from latgate.api.routes import RouteEntry, envelope_at, framework_routes, hot_routes, openapi_document
from latgate.api.serve import Api, serve
from latgate.app.reload import Reloader, UpstreamClients, reload_endpoint
from latgate.app.ui import Activity
from latgate.app.ui import authorize as ui_authorize
from latgate.app.ui import route_entries as ui_route_entries
from latgate.forwarding.recorder import Recorder
from latgate.foundation.config.schema import CATCH_ALL, Config
from latgate.foundation.errors import GatewayError, InvalidRequest, NotFound
from latgate.foundation.metrics import OTHER_MODEL, Metrics
from latgate.live.providers.health import OpenReason
from latgate.live.providers.monitor import run_monitor
from latgate.live.store import SharedStores, run_health_sync
from latgate.live.store.sessions import SessionMaps
from latgate.request.auth import AuthGuard
from latgate.request.gateway import Gateway, request_id
from latgate.request.tracing import Tracing, tracing_from_env
from latgate.routing.headers import refuse_duplicate_headers
from latgate.transport.upstream import UpstreamTransport

log = logging.getLogger("latgate")


class LatgateApp:
    """The ASGI app: proxied POSTs go straight to :func:`~latgate.api.serve.serve` with
    their API's description (:mod:`latgate.api.routes`); everything else
    (operator routes, 404/405, lifespan) goes through FastAPI.

    Why: FastAPI's middleware stack (error, exception, exit-stack, body-limit and
    telemetry layers, the last reading ``os.environ`` on every request) is a measurable
    share of a proxied request's CPU (docs/performance.md); a dict lookup on the path
    costs next to nothing.

    With ``[auth]``, ``/admin/*`` needs an admin key and the model list a valid key
    (proxied routes check keys in :class:`Gateway`); ``/``, ``/healthz``, ``/readyz``,
    ``/metrics`` and ``/openapi.json`` stay open for probes and scrapers.

    Attributes:
        fastapi: the FastAPI app behind it.
        state: the FastAPI app's state (``state.gateway`` is the :class:`Gateway`).
    """

    def __init__(self, fastapi: FastAPI, hot_routes: dict[str, Api]) -> None:
        self.fastapi = fastapi
        self.state = fastapi.state
        self._hot = hot_routes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            api = self._hot.get(path if path[-1:] != "/" else path.rstrip("/"))
            if api is not None:
                request = ProxyRequest(scope, receive)
                request.scope["app"] = self.fastapi
                response = await serve(self.state.gateway, api, request)
                await response(scope, receive, send)
                return
        if scope["type"] == "http" and self.state.gateway.guard is not None:
            denied = _key_required(self.state.gateway.guard, scope)
            if denied is not None:
                await denied(scope, receive, send)
                return
        await self.fastapi(scope, receive, send)


# long: the app's composition root: each long-lived part built once and wired in order (metrics, clients, stores,
# sessions, recorder; the gateway builder a reload calls; the lifespan that owns their tasks and closes them)
def create_app(
    config: Config,
    *,
    transport: UpstreamTransport | None = None,
    env: Mapping[str, str] | None = None,
    metrics_multiprocess_dir: str | None = None,
    tracing: Tracing | None = None,
) -> LatgateApp:
    """A gateway ASGI app for ``config``.

    Args:
        config: the resolved config (see :func:`latgate.foundation.config.load_config`).
        transport: carries the upstream requests instead of latgate's own pool (tests:
            an in-memory :class:`~latgate.transport.upstream.UpstreamTransport`).
        env: environment read for provider keys (``os.environ`` by default).
        metrics_multiprocess_dir: set in each worker of ``serve --workers N``: metrics
            go to prometheus-client's multiprocess files there (see :mod:`latgate.foundation.metrics`).
        tracing: request spans (tests: an in-memory exporter); by default the tracing
            that ``env``'s ``OTEL_*`` variables ask for, if any (:mod:`latgate.request.tracing`).

    The upstream client is opened lazily on the app's event loop and closed on shutdown.
    ``app.state.reloader`` reloads the config file (SIGHUP, ``POST /admin/reload``).
    """
    metrics = Metrics(
        providers=config.providers,
        models=_model_labels(config),
        multiprocess_dir=metrics_multiprocess_dir,
    )
    clients = UpstreamClients(transport=transport)
    stores = SharedStores()
    sessions = SessionMaps()  # one per [state] for the app's lifetime: placements outlive a reload
    activity = Activity(metrics)
    if tracing is None:
        tracing = tracing_from_env(os.environ if env is None else env)
    recorder = Recorder(metrics=metrics, tracing=tracing, recent=activity.requests)  # outlives reloads

    def build_gateway(config: Config, previous: Gateway | None = None) -> Gateway:
        # Everything derived from the config hangs off the Gateway built here, so a
        # reload (latgate/app/reload.py) replaces all of it in one swap, carrying the live
        # state of ``previous`` (the gateway replaced) that still applies.
        gateway = Gateway(
            config=config,
            client=clients.client_for(config),
            metrics=metrics,
            env=env,
            store=stores.store_for(config.state),
            recorder=recorder,
            previous=previous,
            sessions=sessions.map_for(config.state),
        )
        endpoints = [(name, ep.id) for name, p in config.providers.items() for ep in p.endpoints]
        metrics.reconfigure(providers=config.providers, models=_model_labels(config), endpoints=endpoints)
        metrics.create_series(_served_model_labels(config))
        metrics.zero_event_counters(providers=config.providers, endpoints=endpoints, ejection_reasons=get_args(OpenReason))
        metrics.set_provider_info(
            (name, p.role or "", p.connector or "", p.engine or "") for name, p in config.providers.items()
        )
        return gateway

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        health_sync = asyncio.create_task(run_health_sync(lambda: app.state.gateway.health_sync))
        monitor = asyncio.create_task(run_monitor(lambda: (app.state.gateway.pool, app.state.gateway.client)))
        placements = asyncio.create_task(sessions.run())
        try:
            yield
        finally:
            health_sync.cancel()
            monitor.cancel()
            placements.cancel()
            await asyncio.gather(health_sync, monitor, placements, return_exceptions=True)
            await sessions.aclose()
            await stores.aclose()
            await clients.aclose()

    app = FastAPI(
        title="latgate",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,  # Starlette's builds an absolute URL from the Host header: _http_exception's is relative
    )
    app.state.gateway = build_gateway(config)
    app.state.activity = activity
    app.state.reloader = Reloader(state=app.state, build_gateway=build_gateway, env=env)
    app.state.openapi_json = orjson.dumps(openapi_document(version=__version__, extra=app_routes()))
    # every route from the one table; /admin/* and /ui need an admin key when [auth] is on
    app.router.routes.extend(framework_routes(app_routes()))
    app.add_exception_handler(HTTPException, _http_exception)
    app.add_exception_handler(Exception, _unexpected)
    return LatgateApp(app, hot_routes())


def app_routes() -> list[RouteEntry]:
    """The routes of this layer, added to the api layer's table (which cannot import
    them): ``POST /admin/reload`` and the live page's ``/ui`` routes."""
    return [RouteEntry("/admin/reload", ("POST",), reload_endpoint, openapi_doc.reload_config()), *ui_route_entries()]


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's 404/405 in the envelope of the API at that path (OpenAI's elsewhere).
    A path that a route serves without its trailing slash gets a 307 to it, relative
    (RFC 9110 section 10.2.2: never built from the client's Host header)."""
    assert isinstance(exc, HTTPException)  # the handler registered for HTTPException (Starlette types any Exception)
    if exc.status_code == 404:
        location = _without_slash(request)
        if location is not None:
            return Response(status_code=307, headers={"location": location})
        error: GatewayError = NotFound(f"no route for {request.method} {request.url.path}")
    else:
        error = InvalidRequest(str(exc.detail), status=exc.status_code, code="method_not_allowed" if exc.status_code == 405 else None)
    return envelope_at(request.url.path).render(error, request_id=request_id(request.headers.get("x-request-id")), extra_headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    """A bug: logged as one line (no traceback, no request content), 500 envelope."""
    log.error("internal error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    error = GatewayError("internal error in latgate", code="internal_error")
    return error_response(error, request_id="-")


def _without_slash(request: Request) -> str | None:
    """``request``'s path-absolute reference without its trailing slash (and its query)
    when a route serves that path, else ``None``."""
    path = request.url.path
    if not path.endswith("/") or path == "/" or path.startswith(("//", "/\\")):
        return None
    scope = {**request.scope, "path": path.rstrip("/") or "/"}
    if not any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
        return None
    query = request.scope.get("query_string", b"").decode("latin-1")
    return quote(scope["path"], safe="/%:@!$&'()*+,;=-._~") + (f"?{query}" if query else "")


_MODEL_PATHS = ("/v1/models", "/models")


def _key_required(guard: AuthGuard, scope: dict[str, Any]) -> Response | None:
    """The 401/403 envelope for an admin or model-list request without the key it
    needs (a 400 for two of the headers a key comes in), else ``None``."""
    path = scope["path"]
    try:
        refuse_duplicate_headers(scope["headers"])  # two keys: which one to check would be a guess
    except GatewayError as error:
        return error_response(error, request_id="-")
    if path == "/ui" or path.startswith("/ui/"):
        return ui_authorize(guard, scope)
    try:
        if path.startswith("/admin"):
            guard.authorize_admin(Headers(scope=scope))
        elif path.startswith(_MODEL_PATHS):
            guard.authenticate(Headers(scope=scope))
    except GatewayError as error:
        return error_response(error, request_id="-")
    return None


def _served_model_labels(config: Config) -> dict[str, set[str]]:
    """Per provider, the model labels its requests can carry: the public names it
    serves (listed, aliased to it, or any when it lists none), ``other`` when it
    takes names no one lists (it lists none, or the catch-all alias names it)."""
    public = config.public_models()
    served: dict[str, set[str]] = {}
    for name, provider in config.providers.items():
        labels = {m for m in public if provider.serves(m) or name in config.aliases.get(m, {})}
        if not provider.models or name in config.aliases.get(CATCH_ALL, {}):
            labels.add(OTHER_MODEL)
        served[name] = labels
    return served


def _model_labels(config: Config) -> set[str]:
    names = set(config.public_models())
    for provider in config.providers.values():
        names.update(provider.models)
    return names
