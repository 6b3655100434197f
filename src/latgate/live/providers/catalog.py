"""What each engine says it serves: its ``GET /v1/models`` list, kept per endpoint.

vLLM's model objects (``ModelCard`` in ``vllm/entrypoints/openai/models/protocol.py``)
and SGLang's (``ModelCard`` in ``sglang/srt/entrypoints/openai/protocol.py``) carry
``max_model_len``: the context window in tokens, prompt and output together, beyond
which the engine answers 400. latgate learns it per endpoint and model, so a prompt
that cannot fit an endpoint is never sent there (:func:`fits`), and passes the engine's
own model objects on in its ``/v1/models`` (:func:`public_model_object`).

The list is read by the monitor (:mod:`latgate.live.providers.monitor`) for connectors that
set ``models_catalog``, at start-up and every :data:`CATALOG_INTERVAL_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

#: how often each engine's model list is read again (a restarted engine may serve
#: another window)
CATALOG_INTERVAL_SECONDS = 30.0
#: engine fields not passed on: ``root`` is the model's path on the engine's machine
PRIVATE_FIELDS = ("root",)


def parse_catalog(data: bytes) -> dict[str, dict[str, Any]] | None:
    """``{model id: model object}`` from an OpenAI ``/v1/models`` body
    (``{"object": "list", "data": [{"id": ...}, ...]}``); ``None`` when it is not one."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    entries = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(entries, list):
        return None
    return {entry["id"]: entry for entry in entries if isinstance(entry, dict) and isinstance(entry.get("id"), str)}


def context_tokens(catalog: dict[str, dict[str, Any]] | None, model: str) -> int | None:
    """The context window the engine reports for ``model`` (``max_model_len``), or None."""
    if not catalog:
        return None
    window = catalog.get(model, {}).get("max_model_len")
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None


def fits(catalog: dict[str, dict[str, Any]] | None, model: str, prompt_tokens: int) -> bool:
    """Whether a prompt of ``prompt_tokens`` fits ``model``'s window there (True when the
    engine reported none: nothing is known against it). A prompt must leave room for at
    least one output token, as vLLM requires."""
    window = context_tokens(catalog, model)
    return window is None or prompt_tokens < window


def public_model_object(public: str, served: Iterable[str], catalogs: Iterable[dict[str, dict[str, Any]] | None]) -> dict[str, Any]:
    """The ``/v1/models`` object for ``public``: the first engine object found for one of
    its ``served`` names (its extra fields kept, ``id`` the public name, minus
    :data:`PRIVATE_FIELDS`), else latgate's own minimal one."""
    names = list(served)
    for catalog in catalogs:
        for name in names:
            entry = catalog.get(name) if catalog else None
            if entry is not None:
                out = {key: value for key, value in entry.items() if key not in PRIVATE_FIELDS}
                out["id"] = public
                return out
    return {"id": public, "object": "model", "created": 0, "owned_by": "latgate"}


def window_refusal(public: str, prompt_tokens: int, limit: int | None, refused: list[tuple[str, int]]) -> str:
    """The message of a ``context_length_exceeded`` 400: the prompt estimate against the
    model's configured limit or the windows of the providers that could not take it."""
    if limit is not None:
        return f"model {public!r} accepts at most {limit} context tokens; the prompt has about {prompt_tokens}"
    windows = ", ".join(f"{name}: {window} tokens" for name, window in refused)
    return f"the prompt has about {prompt_tokens} tokens, more than the context window of every provider of {public!r} ({windows})"
