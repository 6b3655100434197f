"""Time for the simulator: the real monotonic clock, or virtual time for tests.

The engine only ever asks ``clock.now()`` (seconds, monotonic) and awaits
``clock.sleep(seconds)``, so a test can drive it with :class:`VirtualClock` and
assert exact timings without waiting for them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """What the engine needs from time."""

    def now(self) -> float:
        """Seconds on a monotonic scale (only differences are meaningful)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` (<= 0: yield to the event loop once)."""
        ...


class MonotonicClock:
    """Real time: ``time.monotonic`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class VirtualClock:
    """Discrete-event time for tests of code that runs on one event loop, without I/O.

    ``sleep`` parks the caller until virtual time reaches its deadline; time moves
    only in :meth:`run_until_idle` / :meth:`advance`, which let every runnable task
    run (``settle_rounds`` loop iterations) before firing the earliest timer, so
    concurrent sleepers see one consistent timeline. Example::

        clock = VirtualClock()
        task = asyncio.create_task(work(clock))
        await clock.run_until_idle()   # fires every timer in order; no real waiting
        assert clock.now() == 0.105
    """

    def __init__(self, *, start_seconds: float = 0.0, settle_rounds: int = 50) -> None:
        self._now = start_seconds
        self._settle_rounds = settle_rounds
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self._now + max(0.0, seconds), next(self._order), future))
        await future

    @property
    def pending_timers(self) -> int:
        """Sleepers not yet woken (cancelled ones excluded)."""
        return sum(1 for _, _, future in self._timers if not future.done())

    async def settle(self) -> None:
        """Let every task that can run without time passing do so."""
        for _ in range(self._settle_rounds):
            await asyncio.sleep(0)

    async def run_until_idle(self) -> None:
        """Fire timers in deadline order until no task sleeps on this clock."""
        await self.advance(float("inf"))

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking sleepers in deadline order."""
        target = self._now + seconds
        await self.settle()
        while self._timers:
            deadline, _, future = self._timers[0]
            if deadline > target:
                break
            heapq.heappop(self._timers)
            if future.done():
                continue
            self._now = max(self._now, deadline)
            future.set_result(None)
            await self.settle()
        if target != float("inf"):
            self._now = max(self._now, target)
