"""Hedged attempts: start a second copy of a request when the first is late, keep the
one that produces generated content first, cancel the other.

Both attempts read their upstream up to the first generated content (see
:mod:`latgate.forwarding.forward`); the first to get there calls :meth:`Race.claim` and
wins. A loser that gets there too raises :class:`LostRace`; one still waiting is
cancelled, which closes its upstream response (the engine sees the client go and
frees the batch slot) and releases its in-flight count. Nothing of a loser ever reaches
the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class LostRace(Exception):
    """An attempt got its first content after the other had already won."""


class Race:
    """Who got generated content first."""

    __slots__ = ("won",)

    def __init__(self) -> None:
        self.won = False

    def claim(self) -> bool:
        """True for the first caller only (no await between seeing content and this)."""
        if self.won:
            return False
        self.won = True
        return True


async def run_hedged(
    first: Callable[[], Awaitable[T]],
    second: Callable[[], Awaitable[T] | None],
    *,
    delay_seconds: float,
) -> tuple[T, bool]:
    """Run ``first()``; if it has not finished after ``delay_seconds``, run ``second()`` too
    (which may return None when, by then, there is nowhere to send a copy).

    Returns:
        ``(result, hedge_won)``: the first attempt to succeed, and whether it was the
        second. The other is cancelled and awaited before returning.

    Raises:
        the failure of the attempt that failed last when both fail (a
        :class:`LostRace` only when nothing else was raised), or the first attempt's
        failure when it fails before the delay (no hedge is sent then).
    """
    tasks: list[asyncio.Task[T]] = [asyncio.ensure_future(first())]
    try:
        done, _ = await asyncio.wait(tasks, timeout=delay_seconds)
        if not done:
            copy = second()
            if copy is not None:
                tasks.append(asyncio.ensure_future(copy))
        failure: BaseException | None = None
        pending: set[asyncio.Task[T]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if task not in done:
                    continue
                error = task.exception()
                if error is None:
                    return task.result(), task is not tasks[0]
                if failure is None or not isinstance(error, LostRace):
                    failure = error
        assert failure is not None
        raise failure
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
