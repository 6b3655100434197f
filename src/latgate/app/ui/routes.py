"""``GET /ui`` (the page), ``/ui/ui.js``, ``/ui/ui.css`` and ``/ui/state`` (what the page
polls): with ``[auth]``, an admin key, as ``Authorization: Bearer``, ``x-api-key`` or
HTTP Basic (any user name, the key as password, so a browser asks for it)."""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from latgate import __version__
from latgate.api import openapi_doc
from latgate.api.body import error_response
from latgate.api.routes import RouteEntry
from latgate.foundation.errors import GatewayError
from latgate.request.auth import AuthGuard

STATIC = Path(__file__).resolve().parent / "static"
_FILES = {"index.html": "text/html; charset=utf-8", "ui.js": "text/javascript; charset=utf-8", "ui.css": "text/css; charset=utf-8"}
_NO_STORE = {"cache-control": "no-store"}


def authorize(guard: AuthGuard, scope: dict[str, Any]) -> Response | None:
    """The 401/403 envelope for a ``/ui`` request without an admin key, else ``None``.
    A 401 challenges with HTTP Basic so a browser prompts for the key."""
    headers: Mapping[str, str] = Headers(scope=scope)
    authorization = headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "basic":
        try:
            _, _, password = base64.b64decode(token.strip(), validate=True).decode("latin-1").partition(":")
        except (binascii.Error, ValueError):
            password = ""
        headers = {"authorization": f"Bearer {password}"}
    try:
        guard.authorize_admin(headers)
    except GatewayError as error:
        extra = {"www-authenticate": 'Basic realm="latgate ui"'} if error.status == 401 else None
        response = error_response(error, request_id="-")
        if extra:
            response.headers.update(extra)
        return response
    return None


def _static(name: str) -> Callable[[Request], Awaitable[Response]]:
    body = (STATIC / name).read_bytes()
    media_type = _FILES[name]

    async def endpoint(request: Request) -> Response:
        return Response(body, media_type=media_type, headers=_NO_STORE)

    return endpoint


async def state(request: Request) -> Response:
    """What the page shows: the pool's live numbers (:meth:`ProviderPool.describe`) with
    each provider's gateway queue, recent requests and events (:meth:`Activity.snapshot`)."""
    gateway = request.app.state.gateway
    providers = gateway.pool.describe()
    for name, queue in gateway.forwarder.admission.describe().items():  # the gateway queues (latgate.routing.admission)
        providers[name]["queue"] = queue
    body = {
        "now": time.time(),
        "version": __version__,
        "strategy": gateway.config.routing.strategy,
        "providers": providers,
        **request.app.state.activity.snapshot(),
    }
    return Response(orjson.dumps(body), media_type="application/json", headers=_NO_STORE)


def endpoints() -> dict[str, Callable[[Request], Awaitable[Response]]]:
    """Path -> ``GET`` endpoint of the page and what it polls (routed by :func:`route_entries`)."""
    return {
        "/ui": _static("index.html"),
        "/ui/ui.js": _static("ui.js"),
        "/ui/ui.css": _static("ui.css"),
        "/ui/state": state,
    }


#: each page's OpenAPI summary and media type
_PAGES = {
    "/ui": ("The live routing page (admin key with [auth]; HTTP Basic accepted)", "text/html"),
    "/ui/ui.js": ("The live routing page's script", "text/javascript"),
    "/ui/ui.css": ("The live routing page's style sheet", "text/css"),
    "/ui/state": ("What the live routing page shows: providers, recent requests, events", "application/json"),
}


def route_entries() -> list[RouteEntry]:
    """The page's routes for the route table (:func:`latgate.api.routes.route_table`'s
    ``extra``), each with its OpenAPI operation."""
    pages = endpoints()
    return [
        RouteEntry(path, ("GET",), pages[path], openapi_doc.admin_page(summary, media=media))
        for path, (summary, media) in _PAGES.items()
    ]
