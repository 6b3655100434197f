"""Operator routes: ``/``, ``/healthz``, ``/readyz``, ``/metrics``, ``/admin/providers``,
``/admin/route``, ``/openapi.json`` (routed by :mod:`latgate.api.routes`)."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from latgate import __version__
from latgate.api.body import TOKEN_LIMIT_FIELDS, check_token_limits, error_response, read_json_object
from latgate.foundation.errors import GatewayError
from latgate.live.providers import ProviderRuntime
from latgate.live.providers.monitor import Monitor
from latgate.request.gateway import Gateway, request_id
from latgate.routing.explain import decision_json

_ROOT = orjson.dumps({"service": "latgate", "version": __version__, "status": "ok"})


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def root(request: Request) -> Response:
    """``GET /`` and ``HEAD /``: 200, since clients probe their base URL."""
    return Response(_ROOT, media_type="application/json")


async def healthz(request: Request) -> Response:
    """The process is alive."""
    return Response(b'{"status":"ok"}', media_type="application/json")


async def readyz(request: Request) -> Response:
    """200 when at least one provider endpoint can take traffic (circuit closed, or
    half-open with its trial to come) and some endpoint of the default route has
    answered a request or a probe since start, else 503; the body counts available
    endpoints per provider. Until the default route has answered, each call probes its
    endpoints (as the monitor would) before answering, so a gateway that reaches
    nothing is never reported ready, and its ``status`` names the probes' failure
    causes (``connection refused``...; never an address)."""
    gateway = _gateway(request)
    pool = gateway.pool
    default = pool.providers.get(gateway.config.routing.default_route)
    if default is not None and not _answered(default):
        await Monitor(pool=pool, client=gateway.client).probe_provider(default)
    answered = default is None or _answered(default)
    available = {name: sum(pool.available(ep) for ep in p.endpoints) for name, p in pool.providers.items()}
    ready = answered and any(available.values())
    status = "ready" if ready else "unavailable" if answered or default is None else _unreached(default)
    body = orjson.dumps({"status": status, "available_endpoints": available})
    return Response(body, status_code=200 if ready else 503, media_type="application/json")


def _unreached(default: ProviderRuntime) -> str:
    """Why the default route is not ready: its endpoints' probe failures (causes only,
    never an address), or that nothing is known yet."""
    causes = sorted({ep.probe_cause for ep in default.endpoints if ep.probe_cause})
    if not causes:
        return f"default route {default.name!r} not reached yet"
    return f"default route {default.name!r} has no reachable endpoint: {'; '.join(causes)}"


def _answered(runtime: ProviderRuntime) -> bool:
    return any(ep.answered_at is not None or ep.probe_ok for ep in runtime.endpoints)


async def metrics(request: Request) -> Response:
    gateway = _gateway(request)
    gateway.metrics.set_pool_in_use(gateway.client.pool_in_use())  # sampled at scrape time
    data, content_type = gateway.metrics.render()
    return Response(data, headers={"content-type": content_type})


async def providers(request: Request) -> Response:
    """Each provider's endpoints with the live numbers behind routing decisions: circuit,
    in flight, queue, TTFT fit and prediction, decode speed, engine gauges, last probe
    (ids only, never URLs or keys; see :meth:`ProviderPool.describe`)."""
    gateway = _gateway(request)
    providers = gateway.pool.describe()
    for name, queue in gateway.forwarder.admission.describe().items():
        providers[name]["queue"] = queue
    body = {"strategy": gateway.config.routing.strategy, "providers": providers}
    return Response(orjson.dumps(body), media_type="application/json")


async def route(request: Request) -> Response:
    """``POST /admin/route``: the decision the gateway would make now for the request
    body sent, routing headers read from this request (``X-Latency-Budget-Ms``...), with
    the endpoints considered and their predicted TTFT. Nothing is sent upstream and no
    state changes (``latgate route --url`` prints it)."""
    gateway = _gateway(request)
    try:
        body = await read_json_object(request, max_bytes=gateway.config.server.max_body_bytes)
        check_token_limits(body, TOKEN_LIMIT_FIELDS)  # as the API routes refuse them
        decision = gateway.decide(body, request.headers)
    except GatewayError as error:
        return error_response(error, request_id=request_id(request.headers.get("x-request-id")))
    plan = gateway.forwarder.selector.plan(decision, body, commit=False)
    return Response(orjson.dumps(decision_json(decision, gateway.config, plan)), media_type="application/json")


async def openapi(request: Request) -> Response:
    """``GET /openapi.json``: the document :func:`latgate.api.routes.openapi_document`
    built, serialised once per app."""
    return Response(request.app.state.openapi_json, media_type="application/json")
