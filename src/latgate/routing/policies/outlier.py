"""Latency outliers: an endpoint far slower than its peers is ejected, although it
still answers (a thermally throttled GPU, a noisy neighbour, a degraded link)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def too_slow(own_ms: float, peers_ms: Sequence[float], *, factor: float, margin_ms: float) -> bool:
    """True when ``own_ms`` exceeds ``factor`` times the median of ``peers_ms`` plus
    ``margin_ms`` (all TTFTs for the same prompt size). False without peers.

    Example::

        too_slow(400.0, [20.0, 25.0], factor=3.0, margin_ms=50.0)  # True (> 117.5)
    """
    if not peers_ms:
        return False
    return own_ms > factor * statistics.median(peers_ms) + margin_ms
