"""Every route latgate serves, listed once.

The table gives each route its methods, endpoint and OpenAPI operation; from it come
the three views of the HTTP API:

- :func:`hot_routes`: path -> :class:`~latgate.api.serve.Api` for the proxied POSTs,
  which :class:`latgate.app.asgi.LatgateApp` dispatches without the framework's routing;
- :func:`framework_routes`: every route for the framework (FastAPI), so the operator
  routes are served and other methods on any path get a 405;
- :func:`openapi_document`: ``GET /openapi.json``.

An API's 405 answers and stalled-body 408s use its envelope (:func:`envelope_at`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from latgate.api import admin, openapi_doc
from latgate.api.anthropic import COUNT_TOKENS, MESSAGES
from latgate.api.openai import CHAT_COMPLETIONS, COMPLETIONS, EMBEDDINGS, PREFIXES, get_model, list_models
from latgate.api.responses import RESPONSES
from latgate.api.serve import OPENAI_ENVELOPE, Api, Envelope

#: Every proxied API, in the order the document lists them.
APIS: tuple[Api, ...] = (CHAT_COMPLETIONS, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, COUNT_TOKENS)

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class RouteEntry:
    """One route: ``path`` (Starlette's syntax, e.g. ``/models/{model_id:path}``), the
    ``methods`` it answers, its ``endpoint`` and its OpenAPI path item (``doc``, method ->
    operation; ``None``: not in the document)."""

    path: str
    methods: tuple[str, ...]
    endpoint: Endpoint
    doc: dict[str, Any] | None


def _operator_routes() -> list[RouteEntry]:
    entries = [
        *(
            RouteEntry(prefix + path, ("GET",), endpoint, doc)
            for prefix in PREFIXES
            for path, endpoint, doc in (
                ("/models", list_models, openapi_doc.models()),
                ("/models/{model_id:path}", get_model, openapi_doc.model()),
            )
        ),
        RouteEntry("/", ("GET", "HEAD"), admin.root, openapi_doc.probe("Service probe")),
        RouteEntry("/healthz", ("GET", "HEAD"), admin.healthz, openapi_doc.probe("Liveness: the process is up")),
        RouteEntry(
            "/readyz",
            ("GET", "HEAD"),
            admin.readyz,
            openapi_doc.probe("Readiness: a provider can take traffic (503 when none)"),
        ),
        RouteEntry(
            "/metrics",
            ("GET",),
            admin.metrics,
            openapi_doc.probe("Prometheus metrics", schema={"type": "string"}, media="text/plain"),
        ),
        RouteEntry(
            "/admin/providers",
            ("GET",),
            admin.providers,
            openapi_doc.admin_page("Providers' live state (admin key with [auth])"),
        ),
        RouteEntry("/admin/route", ("POST",), admin.route, openapi_doc.dry_run()),
        RouteEntry("/openapi.json", ("GET",), admin.openapi, None),
    ]
    return entries


def route_table(extra: Sequence[RouteEntry] = ()) -> list[RouteEntry]:
    """Every route: the proxied APIs at each of their paths, the operator routes, then
    ``extra``: the routes of the layer above (``POST /admin/reload``, ``/ui``:
    :func:`latgate.app.asgi.app_routes`), which this table cannot import."""
    proxied = [
        RouteEntry(path, ("POST",), api.endpoint, openapi_doc.proxied(api)) for api in APIS for path in api.paths
    ]
    return [*proxied, *_operator_routes(), *extra]


def hot_routes() -> dict[str, Api]:
    """Path -> API for the proxied POSTs (no trailing slash)."""
    return {path: api for api in APIS for path in api.paths}


def envelope_at(path: str) -> Envelope:
    """The error envelope of the API served at ``path`` (a trailing slash ignored);
    OpenAI's elsewhere."""
    api = _BY_PATH.get(path.rstrip("/") or path)
    return OPENAI_ENVELOPE if api is None else api.envelope


def framework_routes(extra: Sequence[RouteEntry] = ()) -> list[Route]:
    """The table (with ``extra``, as :func:`route_table`) as Starlette routes."""
    return [Route(entry.path, entry.endpoint, methods=list(entry.methods)) for entry in route_table(extra)]


def openapi_document(*, version: str, extra: Sequence[RouteEntry] = ()) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route in the table, with ``extra`` (as
    :func:`route_table`; ``version``: latgate's)."""
    paths = {
        entry.path.replace(":path}", "}"): entry.doc for entry in route_table(extra) if entry.doc is not None
    }
    return openapi_doc.document(paths, version=version)


_BY_PATH = hot_routes()
