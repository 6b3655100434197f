"""The pieces of latgate's own OpenAPI document (served at ``GET /openapi.json``): the
schemas and one builder per kind of operation. The route table
(:mod:`latgate.api.routes`) gives each route its operation and assembles the document
with :func:`document`.

Hand-written: the proxied routes are dispatched outside FastAPI (see
:class:`latgate.app.asgi.LatgateApp`), so FastAPI cannot describe them, and request bodies
are whatever the upstream accepts. The document describes what *latgate* checks (the
required field of each body, ``stream`` a boolean, ``model`` a string), the statuses
it can answer with, its error envelopes (OpenAI's; Anthropic's on ``/v1/messages``),
and the two ways to present a gateway key. It is built once per app (no request pays
for it) and is what the schemathesis test in ``tests/test_hardening_api.py`` runs
against. Shapes follow the OpenAI API reference (``CreateChatCompletionRequest``,
``ErrorResponse``) and Anthropic's Messages API reference, loosely: extra fields pass
through to the provider.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from latgate.api.serve import Api

OPENAPI_VERSION = "3.1.0"
_REF = "#/components/schemas/"
_ERROR_STATUSES = {
    "400": "invalid request (malformed JSON, invalid UTF-8, wrong types, missing field)",
    "401": "no gateway key or an unknown one (with [auth])",
    "403": "model not on the key's allow-list (with [auth])",
    "404": "no provider serves the model",
    "413": "body larger than server.max_body_bytes",
    "415": "body compressed (Content-Encoding) or of a type that is not JSON",
    "429": "the key's RPM/TPM limit, or the provider's, was reached; see Retry-After",
    "502": "no provider could answer",
    "503": "rate-limit state unavailable and fail_open = false",
    "504": "no first token before the deadline",
}


def _json(schema_name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": _REF + schema_name}}}


def _errors(envelope: str) -> dict[str, Any]:
    return _refusals(_ERROR_STATUSES, envelope=envelope)


def _refusals(descriptions: dict[str, str], *, envelope: str = "ErrorResponse") -> dict[str, Any]:
    """Status -> response object, each in ``envelope``."""
    return {status: {"description": text, "content": _json(envelope)} for status, text in descriptions.items()}


_ADMIN_REFUSALS = _refusals({"401": "no key", "403": "not an admin key"})


_OBJECT = {"application/json": {"schema": {"type": "object"}}}


def _operation(
    method: str,
    summary: str,
    *,
    ok: tuple[str, dict[str, Any]],
    refusals: dict[str, Any],
    request_schema: str | None = None,
    parameters: list[dict[str, Any]] | None = None,
    security: list[Any] | None = None,
) -> dict[str, Any]:
    """One path item's operation: ``ok`` is the 200 answer's description and content,
    ``refusals`` the other statuses; ``security=[]`` opens it to everyone."""
    operation: dict[str, Any] = {"summary": summary}
    if security is not None:
        operation["security"] = security
    if parameters is not None:
        operation["parameters"] = parameters
    if request_schema is not None:
        operation["requestBody"] = {"required": True, "content": _json(request_schema)}
    description, content = ok
    operation["responses"] = {"200": {"description": description, "content": content}, **refusals}
    return {method: operation}


def proxied(api: Api) -> dict[str, Any]:
    """The ``post`` operation of a proxied API (:class:`latgate.api.serve.Api`)."""
    ok: dict[str, Any] = {"application/json": {"schema": api.answer_schema or {"type": "object"}}}
    if api.streams:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    answered = "the count" if api.answer_schema else "the provider's answer, relayed"
    return _operation(
        "post", api.summary, request_schema=api.request_schema, ok=(answered, ok), refusals=_errors(api.envelope.schema)
    )


def probe(summary: str, *, schema: dict[str, Any] | None = None, media: str = "application/json") -> dict[str, Any]:
    """A ``get`` open to everyone (probes and scrapers)."""
    content = {media: {"schema": schema or {"type": "object"}}}
    return _operation("get", summary, security=[], ok=(summary, content), refusals={})


def admin_page(summary: str, *, media: str = "application/json") -> dict[str, Any]:
    """A ``get`` that needs an admin key with ``[auth]``."""
    schema = {"type": "object"} if media == "application/json" else {"type": "string"}
    return _operation("get", summary, ok=(summary, {media: {"schema": schema}}), refusals=_ADMIN_REFUSALS)


def models() -> dict[str, Any]:
    """``GET /v1/models``."""
    return _operation(
        "get",
        "Served models and aliases",
        ok=("models", _json("ModelList")),
        refusals=_refusals({"401": "no gateway key"}),
    )


def model() -> dict[str, Any]:
    """``GET /v1/models/{model_id}``."""
    return _operation(
        "get",
        "One model",
        parameters=[{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
        ok=("the model", _json("Model")),
        refusals=_refusals({"401": "no gateway key", "404": "not served"}),
    )


def dry_run() -> dict[str, Any]:
    """``POST /admin/route``."""
    refused = ("400", "401", "403", "404", "413", "415")
    return _operation(
        "post",
        "The decision latgate would make now for this body, with live predictions (admin key with [auth])",
        request_schema="ChatCompletionRequest",
        ok=("the decision", _OBJECT),
        refusals={s: r for s, r in _errors("ErrorResponse").items() if s in refused},
    )


def reload_config() -> dict[str, Any]:
    """``POST /admin/reload``."""
    return _operation(
        "post",
        "Reload the config file (admin key with [auth])",
        ok=("reloaded", _OBJECT),
        refusals={**_refusals({"400": "config rejected; the old one serves on"}), **_ADMIN_REFUSALS},
    )


_MODEL = {"type": "string", "description": "public model name (alias or served name)"}
_STREAM = {"type": "boolean"}
_TOKENS = {"type": "integer", "minimum": 1, "maximum": 64}
_TEXT_OR_PARTS = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}

_SCHEMAS: dict[str, Any] = {
    "ErrorResponse": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "AnthropicError": {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "ChatMessage": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "object"}},
                    {"type": "null"},
                ]
            },
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "model": _MODEL,
            "messages": {"type": "array", "items": {"$ref": _REF + "ChatMessage"}},
            "stream": _STREAM,
            "max_tokens": _TOKENS,
            "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        },
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            "model": _MODEL,
            "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "stream": _STREAM,
            "max_tokens": _TOKENS,
        },
    },
    "EmbeddingRequest": {
        "type": "object",
        "required": ["input"],
        "properties": {
            "model": _MODEL,
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        },
    },
    "ResponsesRequest": {
        "type": "object",
        "required": ["input"],
        "properties": {
            "model": _MODEL,
            "input": _TEXT_OR_PARTS,
            "instructions": {"type": "string"},
            "stream": _STREAM,
            "max_output_tokens": _TOKENS,
        },
    },
    "MessagesRequest": {
        "type": "object",
        "required": ["model", "max_tokens", "messages"],
        "properties": {
            "model": _MODEL,
            "max_tokens": _TOKENS,
            "messages": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {"role": {"enum": ["user", "assistant"]}, "content": _TEXT_OR_PARTS},
                },
            },
            "system": _TEXT_OR_PARTS,
            "stream": _STREAM,
        },
    },
    "CountTokensRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": _MODEL,
            "messages": {"type": "array", "items": {"type": "object"}},
            "system": _TEXT_OR_PARTS,
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"$ref": _REF + "Model"}},
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "owned_by": {"type": "string"},
        },
    },
}


def document(paths: dict[str, Any], *, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of latgate's HTTP API: ``paths`` (path -> path item)
    with the shared schemas and security schemes (``version``: latgate's)."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "latgate",
            "version": version,
            "description": "OpenAI-compatible, latency-aware LLM gateway",
        },
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        "security": [{}, {"bearer": []}, {"apiKey": []}],
    }
