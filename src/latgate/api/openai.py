"""OpenAI-compatible routes: chat completions, completions, embeddings, models.

Each path is served with and without the ``/v1`` prefix, since clients differ on
whether their base URL includes it.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from latgate.gateway import Gateway


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def chat_completions(request: Request):
    return await _gateway(request).handle(request, path="/chat/completions")


async def completions(request: Request):
    return await _gateway(request).handle(request, path="/completions")


async def embeddings(request: Request):
    return await _gateway(request).handle(request, path="/embeddings")


async def list_models(request: Request):
    return _gateway(request).models()


async def get_model(request: Request):
    return _gateway(request).model(request.path_params["model_id"])


def hot_routes() -> dict[str, object]:
    """Path -> handler for the proxied POSTs, dispatched without the framework's routing."""
    table = {"/chat/completions": chat_completions, "/completions": completions, "/embeddings": embeddings}
    return {prefix + path: handler for prefix in ("/v1", "") for path, handler in table.items()}


def routes() -> list[Route]:
    """The OpenAI routes, each at ``/v1/...`` and at ``/...``."""
    table = [
        ("/chat/completions", chat_completions, ["POST"]),
        ("/completions", completions, ["POST"]),
        ("/embeddings", embeddings, ["POST"]),
        ("/models", list_models, ["GET"]),
        ("/models/{model_id:path}", get_model, ["GET"]),
    ]
    out = []
    for prefix in ("/v1", ""):
        for path, endpoint, methods in table:
            out.append(Route(prefix + path, endpoint, methods=methods))
    return out
