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
prompt.
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
    candidates = [i for i, view in enumerate(views) if view.available]
    if not candidates:
        return None
    total = sum(views[i].in_flight for i in candidates) + 1
    bound = math.ceil(load_factor * total / len(candidates))
    ranked = sorted(candidates, key=lambda i: _score(prefix ^ views[i].salt), reverse=True)
    for index in ranked:
        if views[index].in_flight + 1 <= bound:
            return index
    return min(candidates, key=lambda i: views[i].in_flight)


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
