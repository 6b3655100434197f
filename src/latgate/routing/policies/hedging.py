"""Hedged requests: when the first token is late, send the same request to the next
candidate too and keep whichever produces content first (Dean and Barroso, "The Tail
at Scale", 2013: hedge after the 95th-percentile latency, for a few percent more load).
"""

from __future__ import annotations

MIN_HEDGE_DELAY_MS = 5.0
BUDGET_SHARE = 0.25
"""With a budget, no hedge before this share of it: a first token a few ms later than
usual is no reason to double the load."""


def hedge_delay_ms(*, p90_ttft_ms: float, hedge_ttft_ms: float, budget_ms: float | None) -> float:
    """How long to wait for the first attempt's first token before hedging, in ms.

    Args:
        p90_ttft_ms: the first endpoint's 90th-percentile TTFT estimate: a first token
            later than this is unusual.
        hedge_ttft_ms: the hedge target's predicted TTFT.
        budget_ms: the request's budget, or None.

    Returns:
        ``p90_ttft_ms`` (with a budget, at least ``BUDGET_SHARE`` of it), but early
        enough that the hedge can still answer within the budget
        (``budget_ms - hedge_ttft_ms``), and never under ``MIN_HEDGE_DELAY_MS``.

    Example::

        hedge_delay_ms(p90_ttft_ms=150.0, hedge_ttft_ms=60.0, budget_ms=200)  # 140.0
        hedge_delay_ms(p90_ttft_ms=15.0, hedge_ttft_ms=60.0, budget_ms=200)  # 50.0
    """
    delay = p90_ttft_ms
    if budget_ms is not None:
        delay = max(delay, BUDGET_SHARE * budget_ms)
        delay = min(delay, budget_ms - hedge_ttft_ms)
    return max(delay, MIN_HEDGE_DELAY_MS)
