"""Operator routes: ``/``, ``/healthz``, ``/readyz``, ``/metrics``, ``/admin/providers``."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from latgate import __version__
from latgate.gateway import Gateway

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
    """200 when at least one provider endpoint can take traffic, else 503."""
    ready = _gateway(request).pool.any_healthy()
    body = orjson.dumps({"status": "ready" if ready else "unavailable"})
    return Response(body, status_code=200 if ready else 503, media_type="application/json")


async def metrics(request: Request) -> Response:
    data, content_type = _gateway(request).metrics.render()
    return Response(data, headers={"content-type": content_type})


async def providers(request: Request) -> Response:
    """Each provider's endpoints with their live state (ids only, never URLs or keys)."""
    gateway = _gateway(request)
    out = {}
    for name, runtime in gateway.pool.providers.items():
        cfg = runtime.config
        out[name] = {
            "connector": cfg.connector,
            "role": cfg.role,
            "engine": cfg.engine,
            "models": list(cfg.models),
            "key_configured": bool(runtime.auth_headers),
            "endpoints": [
                {
                    "id": ep.config.id,
                    "healthy": ep.healthy,
                    "in_flight": ep.in_flight,
                    "requests": ep.requests,
                    "failures": ep.failures,
                }
                for ep in runtime.endpoints
            ],
        }
    return Response(orjson.dumps({"providers": out}), media_type="application/json")


def routes() -> list[Route]:
    return [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/healthz", healthz, methods=["GET", "HEAD"]),
        Route("/readyz", readyz, methods=["GET", "HEAD"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/providers", providers, methods=["GET"]),
    ]
