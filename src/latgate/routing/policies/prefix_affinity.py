"""Prefix affinity: requests that share a prompt prefix go to the same endpoint, so
an engine with a prefix cache (vLLM automatic prefix caching, SGLang RadixAttention)
prefills the shared part once.

The endpoint is chosen by rendezvous hashing (Thaler and Ravishankar, "Using
name-based mappings to increase hit rates", 1998): each endpoint scores
``mix(prefix_hash ^ salt)`` and the highest wins, so removing an endpoint moves only
its own prefixes. A load bound keeps one hot prefix from overrunning its endpoint
(consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam, 2018): an
endpoint takes the request only while its in-flight count stays within ``load_factor``
times the average; otherwise the next in score order does.

The prefix is the first message (a system prompt, or the first turn of a
conversation, which every later turn repeats) or the first 2 KiB of a completions
prompt. An explicit key from the client wins over it (:func:`client_affinity_key`): the
body's ``prompt_cache_key`` (OpenAI API reference, chat completions and Responses; Codex
sends it), else a session header (``X-Claude-Code-Session-Id`` from Claude Code,
``Session-Id`` / ``X-Codex-Session-Id`` from Codex), so every turn of one session lands
on the endpoint holding its cache. Keys are hashed at once and never kept or logged raw.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

import orjson

from latgate.routing.policies.view import EndpointView

DEFAULT_LOAD_FACTOR = 1.25
AFFINITY_SLACK_MS = 20.0
"""A cached prefix saves prefill, a few to tens of ms: an endpoint predicted slower than
the fastest by more than this loses its affinity."""
PROMPT_PREFIX_CHARS = 2048
_MASK = (1 << 64) - 1
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-codex-session-id")
"""Headers naming a client's session, looked up in this order (lowercase)."""
MAX_CLIENT_KEY_CHARS = 1024


def client_affinity_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> int | None:
    """A stable hash of the client's explicit cache key, or None when it sent none.

    The body's ``prompt_cache_key`` (a non-empty string) wins, else the first non-empty
    header of :data:`SESSION_HEADERS`; values longer than ``MAX_CLIENT_KEY_CHARS`` are
    hashed on their first ``MAX_CLIENT_KEY_CHARS`` characters.

    Args:
        body: the request body (chat completions, or a translated Responses request).
        headers: request headers, looked up by lowercase name.

    Example::

        client_affinity_key({"prompt_cache_key": "repo-1"}, {})  # the same number in every process
        client_affinity_key({}, {"x-claude-code-session-id": "5f0c..."})
    """
    key = body.get("prompt_cache_key")
    if not isinstance(key, str) or not key:
        key = next((value for name in SESSION_HEADERS if (value := headers.get(name))), None)
        if not key:
            return None
        key = "session:" + key
    return zlib.crc32(key[:MAX_CLIENT_KEY_CHARS].encode("utf-8", "replace"))


def prefix_hash(body: Mapping[str, Any]) -> int | None:
    """A stable hash (same in every process) of the request's prompt prefix, or None
    when the body has no prompt to hash."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], Mapping):
        content = messages[0].get("content")
        if isinstance(content, str):
            return zlib.crc32(content.encode())
        if content is not None:
            return zlib.crc32(orjson.dumps(content))
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        return zlib.crc32(prompt[:PROMPT_PREFIX_CHARS].encode())
    return None


def endpoint_salt(endpoint_id: str) -> int:
    """The stable per-endpoint number rendezvous hashing mixes in."""
    return zlib.crc32(endpoint_id.encode()) * 0x9E3779B97F4A7C15 & _MASK


def _score(value: int) -> int:
    """splitmix64's finaliser: a well-mixed 64-bit score."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK
    return value ^ (value >> 31)


def choose_affine(
    views: list[EndpointView], *, prefix: int, load_factor: float = DEFAULT_LOAD_FACTOR
) -> int | None:
    """The index of the prefix's endpoint within the load bound, or None when no view
    is available.

    Example::

        views = [EndpointView(salt=endpoint_salt("p-0")), EndpointView(salt=endpoint_salt("p-1"))]
        choose_affine(views, prefix=prefix_hash({"messages": [{"role": "system", "content": "You are..."}]}))
    """
    scored: list[tuple[int, int]] = []
    total = 1
    for index, view in enumerate(views):
        if view.available:
            total += view.in_flight
            scored.append((_score(prefix ^ view.salt), index))
    if not scored:
        return None
    scored.sort(reverse=True)
    bound = math.ceil(load_factor * total / len(scored))
    for _, index in scored:
        if views[index].in_flight < bound:
            return index
    return min((index for _, index in scored), key=lambda i: views[i].in_flight)


def keep_affinity(
    affine: EndpointView,
    fastest: EndpointView,
    *,
    budget_ms: float | None,
    slack_ms: float = AFFINITY_SLACK_MS,
) -> bool:
    """True when the prefix's endpoint should take the request rather than the fastest:
    it is predicted no more than ``slack_ms`` slower, and with a budget it is expected
    (90th percentile) to meet it, or to do no worse than the fastest.

    Example::

        keep_affinity(EndpointView(predicted_ttft_ms=30.0), EndpointView(predicted_ttft_ms=20.0), budget_ms=None)  # True
    """
    if affine.predicted_ttft_ms > fastest.predicted_ttft_ms + slack_ms:
        return False
    if budget_ms is None:
        return True
    return affine.p90_ttft_ms <= budget_ms or affine.p90_ttft_ms <= fastest.p90_ttft_ms
