"""A labelled Prometheus histogram child fed in batches: one stream's inter-token gaps
binned here and added to the child every :data:`BATCH_SAMPLES` samples
(:meth:`latgate.foundation.metrics.Metrics.itl_batch` makes one per stream).
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import Histogram

#: samples a :class:`HistogramBatch` holds before adding them to its histogram
BATCH_SAMPLES = 64


class HistogramBatch:
    """Samples for one labelled histogram child, binned here and added to the child
    every :data:`BATCH_SAMPLES` samples and at :meth:`flush`.

    Why: ``Histogram.observe`` takes a lock for the sum and another for the bucket on
    every sample (about a microsecond each time; one sample per streamed token). Binning
    is a ``bisect`` and an add. The child ends up with the same buckets, count and sum
    as if each sample had been observed (prometheus-client counts each sample in the
    first bucket whose bound is >= it, as ``bisect_left`` finds it); a scrape may lag a
    stream by up to :data:`BATCH_SAMPLES` samples. Needs prometheus-client's histogram
    child internals (``_upper_bounds``, ``_buckets``, ``_sum``, present since 0.4);
    without them every sample goes to ``observe``.
    """

    __slots__ = ("_bounds", "_buckets", "_child", "_counts", "_pending", "_sum_seconds", "_total")

    def __init__(self, child: Histogram) -> None:
        self._child = child
        bounds = getattr(child, "_upper_bounds", None)
        self._buckets = getattr(child, "_buckets", None)
        self._total = getattr(child, "_sum", None)
        if bounds is None or self._buckets is None or self._total is None or len(bounds) != len(self._buckets):
            self._buckets = None
            bounds = ()
        self._bounds = list(bounds)
        self._counts = [0] * len(self._bounds)
        self._pending = 0
        self._sum_seconds = 0.0

    def observe(self, seconds: float) -> None:
        """One sample (seconds, >= 0)."""
        if self._buckets is None:
            self._child.observe(seconds)
            return
        self._counts[bisect_left(self._bounds, seconds)] += 1
        self._sum_seconds += seconds
        self._pending += 1
        if self._pending >= BATCH_SAMPLES:
            self.flush()

    def observe_many(self, seconds: float, count: int) -> None:
        """``count`` samples of the same value (seconds, >= 0)."""
        if self._buckets is None:
            for _ in range(count):
                self._child.observe(seconds)
            return
        self._counts[bisect_left(self._bounds, seconds)] += count
        self._sum_seconds += seconds * count
        self._pending += count
        if self._pending >= BATCH_SAMPLES:
            self.flush()

    def flush(self) -> None:
        """Add the held samples to the histogram (idempotent)."""
        if not self._pending or self._buckets is None or self._total is None:
            return
        self._total.inc(self._sum_seconds)
        counts = self._counts
        for index, count in enumerate(counts):
            if count:
                self._buckets[index].inc(count)
                counts[index] = 0
        self._pending = 0
        self._sum_seconds = 0.0
