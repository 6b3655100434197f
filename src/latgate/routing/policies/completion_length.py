"""Expected completion length, robust to one client: what a request that names no cap is
expected to generate, and what a slot's lease is priced at.

One pool-wide recency-weighted mean of the tokens streams produced can be moved by a
single client: a run of long completions from one key makes every request look long
(every wait predicted long, every fair-share cost inflated), a run of one-token ones
makes the pool look idle. So the estimate here is

- a *median* over a bounded window of recent streams (:data:`WINDOW`): a client must
  produce more than half of the window to move it at all, and its effect is bounded by
  the values it produced;
- kept *per tenant* (the key's name, else the client's address) and *per class*: a
  request is expected to generate what its own tenant's recent streams did, once there
  are :data:`MIN_OWN_STREAMS` of them; before that what its class's did, then the
  pool's. One tenant's streams move another's estimate only through the class and pool
  medians;
- *capped* by the request's own cap (``max_tokens`` and its aliases): it cannot
  generate more than it asked for.

Pure data: nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict, deque

WINDOW = 64
"""Streams kept per tenant, per class and for the pool."""
MIN_OWN_STREAMS = 8
"""A tenant's own median is used from this many of its streams on."""
MAX_TENANTS = 1024
"""Tenants remembered at most (the least recently seen are forgotten first)."""


class _Window:
    """The last :data:`WINDOW` lengths in arrival order (``recent``), the same values
    sorted, and their median, kept as each stream is added (one insertion and one removal
    in the sorted list), so a request reads its estimate without sorting."""

    __slots__ = ("median", "ordered", "recent")

    def __init__(self) -> None:
        self.recent: deque[int] = deque()
        self.ordered: list[int] = []
        self.median = 0.0  # of ``ordered`` (the mean of the two middle values for an even count); 0.0 while empty

    def add(self, tokens: int) -> None:
        recent, ordered = self.recent, self.ordered
        if len(recent) >= WINDOW:
            del ordered[bisect_left(ordered, recent.popleft())]
        recent.append(tokens)
        insort(ordered, tokens)
        half = len(ordered) // 2
        self.median = float(ordered[half]) if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2.0


class CompletionLengths:
    """Recent completion lengths (tokens) by tenant, by class and pool-wide.

    Example::

        lengths = CompletionLengths()
        for tokens in (40, 40, 40, 5000):     # one outlier
            lengths.observe(tokens, priority=1, tenant="a")
        lengths.expected(priority=1, tenant="b")            # 40.0: the median
        lengths.expected(priority=1, tenant="b", cap=16)    # 16: its own cap
    """

    __slots__ = ("_by_class", "_by_tenant", "_pool")

    def __init__(self) -> None:
        self._pool = _Window()
        self._by_class: dict[int, _Window] = {}
        self._by_tenant: OrderedDict[str, _Window] = OrderedDict()

    def observe(self, tokens: int, *, priority: int | None = None, tenant: str = "") -> None:
        """One stream produced ``tokens`` completion tokens (ignored unless > 0), for a
        request of class ``priority`` (None: unknown) charged to ``tenant``."""
        if tokens <= 0:
            return
        self._pool.add(tokens)
        if priority is not None:
            window = self._by_class.get(priority)
            if window is None:
                window = self._by_class[priority] = _Window()
            window.add(tokens)
        if tenant:
            window = self._by_tenant.get(tenant)
            if window is None:
                window = _Window()
                if len(self._by_tenant) >= MAX_TENANTS:
                    self._by_tenant.popitem(last=False)
                self._by_tenant[tenant] = window
            else:
                self._by_tenant.move_to_end(tenant)
            window.add(tokens)

    def expected(
        self, *, priority: int | None = None, tenant: str = "", cap: int | None = None
    ) -> float | None:
        """The tokens a request is expected to generate: the median of its tenant's recent
        streams (from :data:`MIN_OWN_STREAMS` on), else of its class's, else of the
        pool's, at most ``cap`` (its own ``max_tokens``); ``cap`` alone (or None) before
        any stream."""
        own = self._by_tenant.get(tenant) if tenant else None
        window = own if own is not None and len(own.recent) >= MIN_OWN_STREAMS else None
        if window is None and priority is not None:
            window = self._by_class.get(priority)  # a class's window is never empty
        if window is None:
            window = self._pool
            if not window.recent:
                return None if cap is None else float(cap)
        value = window.median
        return value if cap is None else min(value, float(cap))

    @property
    def pool_median(self) -> float | None:
        """The median of the pool's recent streams (None before any)."""
        return self._pool.median if self._pool.recent else None
