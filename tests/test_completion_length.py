"""The completion-length estimate's sorted windows give the same medians as sorting the
last WINDOW values of each tenant, class and the pool afresh (routing/policies/completion_length.py)."""

from __future__ import annotations

import random
import statistics
from collections import defaultdict, deque

from latgate.routing.policies.completion_length import MIN_OWN_STREAMS, WINDOW, CompletionLengths


def test_medians_equal_a_fresh_sort_of_each_window() -> None:
    rng = random.Random(24)
    lengths = CompletionLengths()
    pool: deque[int] = deque(maxlen=WINDOW)
    by_class: dict[int, deque[int]] = defaultdict(lambda: deque(maxlen=WINDOW))
    by_tenant: dict[str, deque[int]] = defaultdict(lambda: deque(maxlen=WINDOW))
    for _ in range(3000):
        tokens = rng.choice([rng.randint(1, 50), rng.randint(1, 5000), 64])
        priority, tenant = rng.randint(0, 2), rng.choice("abcd")
        lengths.observe(tokens, priority=priority, tenant=tenant)
        pool.append(tokens)
        by_class[priority].append(tokens)
        by_tenant[tenant].append(tokens)
        ask_priority, ask_tenant = rng.randint(0, 3), rng.choice("abcde")
        own = by_tenant.get(ask_tenant)
        if own is not None and len(own) >= MIN_OWN_STREAMS:
            window = own
        else:
            window = by_class.get(ask_priority) or pool
        assert lengths.expected(priority=ask_priority, tenant=ask_tenant) == float(statistics.median(window))
        assert lengths.pool_median == float(statistics.median(pool))


def test_nothing_observed_gives_the_cap_or_none() -> None:
    lengths = CompletionLengths()
    lengths.observe(0, priority=1, tenant="a")  # ignored
    assert lengths.expected(priority=1, tenant="a") is None
    assert lengths.expected(cap=16) == 16.0
    assert lengths.pool_median is None
