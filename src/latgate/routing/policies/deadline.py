"""The first-token deadline of one attempt: when latgate gives up on an endpoint that
has sent nothing yet and fails over, before the first byte reached the client."""

from __future__ import annotations

STALL_FACTOR = 2.0
"""An attempt is stalled when it takes this many times its predicted TTFT (and more
than the budget)."""


def first_token_deadline_ms(
    *, budget_ms: float | None, predicted_ttft_ms: float, configured_ms: float | None, last_attempt: bool
) -> float | None:
    """The attempt's first-token deadline in ms from sending it, or None for none.

    Args:
        budget_ms: the request's TTFT budget, or None.
        predicted_ttft_ms: the endpoint's predicted TTFT for this request.
        configured_ms: ``first_token_timeout_sec`` in ms, or None.
        last_attempt: no other endpoint or provider is left to try.

    Returns:
        With a budget and something left to try: the budget, or twice the prediction
        when that is longer (a request predicted to be slow is not cut short for
        being as slow as predicted), capped by ``configured_ms``. Otherwise
        ``configured_ms``: giving up on the last attempt helps nobody.

    Example::

        first_token_deadline_ms(budget_ms=200, predicted_ttft_ms=30, configured_ms=None, last_attempt=False)  # 200
    """
    if budget_ms is None or last_attempt:
        return configured_ms
    deadline = max(float(budget_ms), STALL_FACTOR * predicted_ttft_ms)
    return deadline if configured_ms is None else min(deadline, configured_ms)
