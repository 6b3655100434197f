"""Overflow: keep the preferred provider while it is predicted to meet the request's
time-to-first-token budget; otherwise move to the candidate predicted to finish first
among those predicted to meet it (:mod:`.e2e`)."""

from __future__ import annotations

from collections.abc import Sequence


def choose_overflow(
    p90_ttft_ms: Sequence[float], *, e2e_ms: Sequence[float], budget_ms: float, keep_preferred: bool = True
) -> int:
    """Which candidate takes a request with a TTFT budget.

    Args:
        p90_ttft_ms: each candidate's pessimistic TTFT estimate in ms (its 90th
            percentile); index 0 is the preferred provider, the others the overflow
            candidates in order. ``inf`` for a candidate that cannot take traffic.
        e2e_ms: each candidate's predicted end-to-end latency in ms, same order.
        budget_ms: the request's TTFT budget.
        keep_preferred: index 0 is the rule's provider, kept while it meets the budget;
            False when it was already left (its pool refused to hold the request) and
            it competes like the others.

    Returns:
        0 while the preferred one meets the budget (with ``keep_preferred``); else, of
        the candidates predicted to meet the budget, the one with the lowest predicted
        e2e (the earliest on ties); when none is, the lowest TTFT estimate (the one
        nearest to the budget, as the budget is a TTFT budget). The TTFT budget decides
        who may take the request; e2e only chooses among those that meet it.

    Example::

        # a fast-TTFT, slow-decode pool and a fast-decode one, both within budget
        choose_overflow([450.0, 40.0, 90.0], e2e_ms=[900.0, 5600.0, 700.0], budget_ms=200)  # 2
    """
    if keep_preferred and p90_ttft_ms[0] <= budget_ms:
        return 0
    meeting = [i for i, ttft in enumerate(p90_ttft_ms) if ttft <= budget_ms]
    if not meeting:
        return min(range(len(p90_ttft_ms)), key=lambda i: (p90_ttft_ms[i], i))
    return min(meeting, key=lambda i: (e2e_ms[i], i))
