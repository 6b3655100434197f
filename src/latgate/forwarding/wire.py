"""What latgate sends on the wire around a proxied request: the upstream body, the
client's response headers, and the per-stream edits the SSE tap makes (usage asked for
on the client's behalf, the model name rewritten back to an alias)."""

from __future__ import annotations

import functools
import re
import time
from typing import Any

import orjson

from latgate.forwarding.exchange import Exchange
from latgate.forwarding.largebody import dumps_in_slices, is_large
from latgate.foundation.errors import GatewayError, InvalidRequest
from latgate.live.providers.runtime import ProviderRuntime
from latgate.live.providers.stream_options import OWN_STREAM_OPTIONS
from latgate.routing.targets import Target


def upstream_payload(
    body: dict[str, Any],
    target: Target,
    provider: ProviderRuntime,
    *,
    stream: bool,
    path: str,
    stream_options: bool = True,
) -> bytes:
    """The upstream body: the client's, with the upstream model, the provider's
    ``extra_body`` fields the client did not set, and usage asked for on streams
    whose client did not say (see :func:`ask_usage`). ``stream_options=False`` (a
    stream sent again after a refusal of the field), or a provider that refused it
    lately (:mod:`latgate.live.providers.stream_options`): none is sent (latgate counts
    usage itself). The body is encoded
    from what latgate parsed (and routed, authorized and counted on): a key the client
    sent twice reaches the upstream once, as parsed, at any depth.

    Raises:
        InvalidRequest: the body was parsed but cannot be encoded again: arrays and
            objects nested deeper than ``orjson`` encodes (:data:`MAX_NESTING`; 400).
    """
    out = dict(body)
    out["model"] = target.model
    for key, value in provider.config.extra_body.items():
        out.setdefault(key, value)
    if not stream_options or provider.stream_options.withheld(time.monotonic()):
        out.pop("stream_options", None)
    elif stream and ask_usage(body, path):
        options = dict(out.get("stream_options") or {})
        options["include_usage"] = True
        out["stream_options"] = options
    try:
        return dumps_in_slices(out) if is_large(out) else orjson.dumps(out)
    except orjson.JSONEncodeError as exc:
        if "recursion" in str(exc).lower():  # parsed (orjson reads 1,024 levels), too deep to encode
            raise nesting_too_deep() from None
        raise InvalidRequest(f"request body cannot be forwarded: {exc}") from None


#: The deepest nesting of arrays and objects latgate forwards, the body's own object
#: counted: ``orjson``'s encoding limit (it parses 1,024). No client sends bodies near
#: it (a tool's JSON Schema is a few levels deep); a deeper one is refused rather than
#: forwarded as the client's bytes, whose duplicate keys would reach the upstream unseen.
MAX_NESTING = 254


def nesting_too_deep() -> InvalidRequest:
    """The 400 for a body nested deeper than :data:`MAX_NESTING` levels."""
    return InvalidRequest(
        f"request body is nested too deeply: at most {MAX_NESTING} levels of arrays and objects are accepted",
        code="nesting_too_deep",
    )


#: statuses with which an upstream may refuse a field it does not know (422: FastAPI-style servers)
_FIELD_REJECTED_STATUSES = (400, 422)


def refuses_stream_options(error: GatewayError, payload: bytes) -> bool:
    """True when ``error`` (an upstream's answer to ``payload``) refuses the request's
    ``stream_options`` (a 400 or 422 naming them, as OpenAI-compatible APIs that do not
    know the field answer): the stream is then sent once more without them."""
    return (
        error.status in _FIELD_REJECTED_STATUSES
        and ("stream_options" in error.message or error.param == "stream_options")
        and b'"stream_options":' in payload
    )


def sends_own_stream_options(body: dict[str, Any], path: str) -> bool:
    """True when the ``stream_options`` a stream of ``body`` goes with are latgate's own
    well-formed ``{"include_usage": true}`` (asked for by latgate, or the client's
    identical ones): only their refusal is evidence that a provider does not take the
    field (:mod:`latgate.live.providers.stream_options`), not a refusal of what else a client
    wrote there."""
    options = body.get("stream_options")
    return options == OWN_STREAM_OPTIONS or (not options and ask_usage(body, path))


#: ``stream_options`` members that are booleans (OpenAI's API reference; vLLM's
#: ``continuous_usage_stats``): another type is the client's 400, never sent upstream
BOOLEAN_STREAM_OPTIONS = ("include_usage", "include_obfuscation", "continuous_usage_stats")


def check_stream_options(options: object) -> None:
    """Raise :class:`~latgate.foundation.errors.InvalidRequest` (400, ``param`` naming the member)
    unless ``options`` (a request's ``stream_options``) is absent, null, or an object
    whose :data:`BOOLEAN_STREAM_OPTIONS` members are booleans or null."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options", code="invalid_type")
    for name in BOOLEAN_STREAM_OPTIONS:
        value = options.get(name)
        if value is not None and not isinstance(value, bool):
            raise InvalidRequest(
                f"'stream_options.{name}' must be a boolean", param=f"stream_options.{name}", code="invalid_type"
            )


def client_headers(exchange: Exchange, content_type: str) -> list[tuple[bytes, bytes]]:
    """The response headers latgate sends its client (encoded): the upstream's media
    type, no caching for streams, and where the request went (docs/routing.md,
    "Headers")."""
    pairs = [(b"content-type", media_type(content_type).encode())]
    if exchange.stream:  # no caching or proxy buffering of an event stream
        pairs += _STREAM_HEADERS
    pairs += [
        (b"x-request-id", exchange.request_id.encode("latin-1", "replace")),
        (b"x-latgate-provider", exchange.provider.encode("latin-1", "replace")),
        (b"x-latgate-route-reason", exchange.reason.encode("latin-1", "replace")),
        (b"x-latgate-prompt-tokens", str(exchange.routed_prompt_tokens).encode()),
    ]
    if exchange.upstream_model != exchange.public_model:
        pairs.append((b"x-latgate-upstream-model", exchange.upstream_model.encode("latin-1", "replace")))
    if exchange.fallback_model:
        pairs.append((b"x-latgate-fallback-model", exchange.fallback_model.encode("latin-1", "replace")))
    if exchange.route_candidates:
        pairs.append((b"x-latgate-route-candidates", exchange.route_candidates.encode("latin-1", "replace")))
    if exchange.admission:
        pairs.append((b"x-latgate-admission", exchange.admission.encode("latin-1", "replace")))
    if exchange.queue_ms is not None:  # it waited in the gateway queue (latgate.routing.admission)
        pairs.append((b"x-latgate-queue-ms", str(round(exchange.queue_ms)).encode()))
    return pairs


_STREAM_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


_MEDIA_TYPE = re.compile(r"[a-z0-9!#$&^_.+-]{1,64}/[a-z0-9!#$&^_.+-]{1,64}")
_CHARSET = re.compile(r'charset="?([a-z0-9._:-]{1,40})"?')


@functools.lru_cache(maxsize=64)  # upstreams repeat the same few values
def media_type(content_type: str) -> str:
    """The upstream's media type with only its safe parameter, ``charset`` (a short
    token, RFC 9110 8.3.1), kept: any other parameter could echo anything, a key
    included; ``application/octet-stream`` when it is not a media type."""
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    if not _MEDIA_TYPE.fullmatch(media):
        return "application/octet-stream"
    for param in params.split(";"):
        charset = _CHARSET.fullmatch(param.strip().lower())
        if charset:
            return f"{media}; charset={charset.group(1)}"
    return media


def tap_drop(body: dict[str, Any]) -> bool:
    """True when the client did not ask for usage on its stream (latgate asks instead and
    keeps the usage-only chunk from the client)."""
    options = body.get("stream_options")
    return not (isinstance(options, dict) and options.get("include_usage"))


def ask_usage(body: dict[str, Any], path: str) -> bool:
    """True when latgate adds ``stream_options.include_usage: true`` to a stream: the
    client did not ask for usage and did not refuse it either (an explicit
    ``include_usage: false`` is sent as the client wrote it, and the stream's tokens are
    then counted from its chunks, marked estimated). Not on ``/responses``, whose streams
    always end with their usage."""
    if path == "/responses" or not tap_drop(body):
        return False
    options = body.get("stream_options")
    return not (isinstance(options, dict) and "include_usage" in options)


def model_rewrite(body: dict[str, Any], target: Target) -> tuple[str, str] | None:
    """``(served, public)`` when the client asked for another name than the one sent
    upstream (an alias): streamed chunks are rewritten back to the client's name."""
    public = body.get("model")
    if isinstance(public, str) and public != target.model:
        return (target.model, public)
    return None
