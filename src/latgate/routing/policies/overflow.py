"""Overflow: keep the preferred provider while it is predicted to meet the request's
time-to-first-token budget; otherwise move to the candidate most likely to meet it."""

from __future__ import annotations

from collections.abc import Sequence


def choose_overflow(estimates_ms: Sequence[float], *, budget_ms: float) -> int:
    """Which candidate takes a request with a TTFT budget.

    Args:
        estimates_ms: each candidate's TTFT estimate in ms (a pessimistic one such as
            the 90th percentile); index 0 is the preferred provider, the others the
            overflow candidates in order. ``inf`` for a candidate that cannot take
            traffic.
        budget_ms: the request's budget.

    Returns:
        0 while the preferred one meets the budget; else the index of the lowest
        estimate (the earliest on ties), whether or not it meets the budget: when none
        can, the best one.

    Example::

        choose_overflow([450.0, 60.0, 900.0], budget_ms=200)  # 1
    """
    if estimates_ms[0] <= budget_ms:
        return 0
    best = 0
    for index in range(1, len(estimates_ms)):
        if estimates_ms[index] < estimates_ms[best]:
            best = index
    return best
