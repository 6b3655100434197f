"""Predicted end-to-end latency: time to first token plus the decode of the rest.

``e2e = TTFT + ITL x (completion_tokens - 1)``: after its first token, a stream's
remaining tokens arrive one time per output token (ITL, or TPOT) apart. A pool with a
fast first token but slow decode (a throughput pool running large batches) finishes
later than a pool with a slightly later first token and fast decode as soon as the
answer is more than a few tokens long, so a choice between them on TTFT alone can cost
the request many times its e2e latency.

The completion length is not known before the answer; the expectation is what recent
streams produced (:mod:`latgate.routing.policies.completion_length`: the request's
tenant's, class's or pool's median) at most the request's own cap
(``max_completion_tokens``, ``max_tokens``, or the Responses API's ``max_output_tokens``):
it cannot generate more than it asked for. Before any stream, the cap, else ``[routing]
expected_completion_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COMPLETION_CAP_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
"""The request fields capping its completion, first found wins (OpenAI chat's current
and legacy names, the Responses API's; Anthropic's Messages API uses ``max_tokens``)."""


def expected_completion_tokens(
    body: Mapping[str, Any], *, default_tokens: int, observed_tokens: float | None = None
) -> tuple[int, str]:
    """The completion tokens a request is expected to produce, and where that came from.

    Args:
        body: the request body as parsed JSON.
        default_tokens: ``[routing] expected_completion_tokens`` (>= 1).
        observed_tokens: what recent streams produced
            (:meth:`~latgate.routing.policies.completion_length.CompletionLengths.expected`),
            or None before any stream.

    Returns:
        ``(tokens, source)``: the observed length (rounded, at least 1) and
        ``"observed"`` when it is below the request's cap (the first positive integer
        among :data:`COMPLETION_CAP_FIELDS`) or there is none; else the cap and its field
        name; else ``(default_tokens, "default")``. Booleans and non-integers are not caps.

    Example::

        expected_completion_tokens({"max_tokens": 64}, default_tokens=256)  # (64, "max_tokens")
        expected_completion_tokens({"max_tokens": 64}, default_tokens=256, observed_tokens=41.6)  # (42, "observed")
        expected_completion_tokens({"max_tokens": 8}, default_tokens=256, observed_tokens=41.6)   # (8, "max_tokens")
        expected_completion_tokens({}, default_tokens=256)                  # (256, "default")
    """
    observed = None if observed_tokens is None else max(1, round(observed_tokens))
    for name in COMPLETION_CAP_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return (observed, "observed") if observed is not None and observed < value else (value, name)
    if observed is not None:
        return observed, "observed"
    return default_tokens, "default"


def predicted_e2e_ms(*, ttft_ms: float, itl_ms: float, completion_tokens: int) -> float:
    """Predicted e2e latency in ms: ``ttft_ms`` plus ``itl_ms`` per completion token
    after the first (``completion_tokens`` >= 1; ``inf`` stays ``inf``).

    Example::

        predicted_e2e_ms(ttft_ms=20.0, itl_ms=22.0, completion_tokens=256)  # 5630.0
        predicted_e2e_ms(ttft_ms=40.0, itl_ms=2.5, completion_tokens=256)   # 677.5
    """
    return ttft_ms + itl_ms * max(0, completion_tokens - 1)
