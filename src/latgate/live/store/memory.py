"""In-process store: one replica's rate limits, in a dict.

Used when ``[state]`` has no ``redis_url``. Each gateway process (each ``--workers``
worker too) then keeps its own limits, so N processes admit up to N times a key's
limit; use Redis for limits that hold across replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from latgate.live.store.base import EPSILON_SECONDS, Quota, Verdict, corrected_tat, gcra_charge, room_in


class MemoryStore:
    """Rate-limit quotas in this process (see :mod:`latgate.live.store.base` for GCRA).

    Args:
        clock: seconds, monotonic (``time.monotonic`` by default; tests inject one).

    No lock is needed: every method runs without awaiting, so on one event loop each
    call is atomic. Corrections (:meth:`adjust`) wait for the quota's next charge and
    are applied with it, as the Redis store's script does, so both stores give the same
    verdicts to the same sequence of charges and corrections.
    """

    shared = False

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tat: dict[str, float] = {}
        self._corrections: dict[str, float] = {}  # quota key -> seconds not yet applied

    async def acquire(self, quotas: Sequence[Quota]) -> Verdict:
        """Charge every quota or none; see :meth:`latgate.live.store.base.SharedStore.acquire`."""
        now = self._clock()
        charged: list[tuple[str, float, float, float]] = []
        retry_after = 0.0
        corrections = self._corrections
        for quota in quotas:
            tat = self._tat.get(quota.key, now)
            if corrections and quota.key in corrections:
                tat = corrected_tat(
                    tat, now, correction_seconds=corrections.pop(quota.key), window_seconds=quota.window_seconds
                )
                self._store(quota.key, tat, now)
            new_tat, over = gcra_charge(
                tat, now, cost=quota.cost, limit=quota.limit, window_seconds=quota.window_seconds
            )
            if over > EPSILON_SECONDS:
                retry_after = max(retry_after, over)
            charged.append((quota.key, max(tat, now), new_tat, quota.window_seconds))
        allowed = retry_after == 0
        if allowed:
            for key, _, new_tat, _ in charged:
                self._tat[key] = new_tat
        rooms = tuple(
            room_in(new if allowed else old, now, step_seconds=new - old, window_seconds=window)
            for _, old, new, window in charged
        )
        return Verdict(allowed=allowed, retry_after_seconds=retry_after, room_in_seconds=rooms)

    async def adjust(self, quota: Quota, *, delta: float) -> None:
        """Correct a past charge by ``delta`` units, applied with the quota's next charge."""
        seconds = delta * quota.window_seconds / quota.limit
        self._corrections[quota.key] = self._corrections.get(quota.key, 0.0) + seconds

    def _store(self, key: str, tat: float, now: float) -> None:
        if tat <= now:
            self._tat.pop(key, None)
        else:
            self._tat[key] = tat

    async def aclose(self) -> None:
        """Nothing to release."""
