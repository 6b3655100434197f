"""Retry and hedge budgets: extra attempts stay a bounded share of a provider's traffic.

A retry or a hedge is one more attempt on a provider that is already failing or slow;
when every request retries, a saturated pool gets several times its load exactly when it
can least take it. So, per provider, the retries plus hedges in flight are at most
``retry_budget_percent`` of the requests active there, and never fewer than
``retry_budget_min`` (a quiet provider can still retry). This is Envoy's retry budget
(``budget_percent``, default 20 %, and ``min_retry_concurrency``:
https://www.envoyproxy.io/docs/envoy/latest/api-v3/config/cluster/v3/circuit_breaker.proto).

A hedge is also withheld when most of the provider's endpoints are slow at once (at
capacity, or with a queue ahead): a copy would only add to the queue it means to
avoid (:func:`hedge_suppressed`).
"""

from __future__ import annotations

from collections.abc import Sequence


def within_budget(*, extra_in_flight: int, active: int, percent: float, floor: int) -> bool:
    """True when one more retry or hedge keeps the extra attempts within the budget.

    Args:
        extra_in_flight: retries and hedges of the provider in flight now.
        active: requests in flight on the provider now (first attempts and extra ones).
        percent: ``retry_budget_percent`` (0-100).
        floor: ``retry_budget_min``: this many extra attempts are always allowed.

    Example::

        within_budget(extra_in_flight=1, active=10, percent=20.0, floor=0)  # True: 2 <= 2
        within_budget(extra_in_flight=2, active=10, percent=20.0, floor=0)  # False
    """
    allowed = max(float(floor), percent / 100.0 * active)
    return extra_in_flight + 1 <= allowed


def hedge_suppressed(slow: Sequence[bool], *, share: float = 0.5) -> bool:
    """True when more than ``share`` of the endpoints (``slow``: one flag each, at
    capacity or queueing) are slow at once; never with a single endpoint, whose copy
    goes elsewhere."""
    if len(slow) < 2:
        return False
    return sum(1 for flag in slow if flag) > share * len(slow)
