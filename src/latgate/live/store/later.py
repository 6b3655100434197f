"""Run a store's pending Redis work once, a little later, off the request path.

Writes that can wait (rate-limit corrections, session placements) are batched: the first
one arms a timer, later ones join the batch, and when the timer fires one task sends the
whole batch. :meth:`SendLater.cancel` and :meth:`SendLater.wait` let ``aclose`` send what
is left itself and wait for a batch already on its way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class SendLater:
    """Calls ``send`` once, ``delay_seconds`` after the first :meth:`schedule` since the
    last call; failures are ``send``'s to handle (a task's exception is not raised)."""

    def __init__(self, send: Callable[[], Awaitable[None]], *, delay_seconds: float) -> None:
        self._send = send
        self._delay_seconds = delay_seconds
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def schedule(self) -> None:
        """Arm the timer unless it is armed; without a running loop nothing is armed
        (the owner's next explicit send or ``aclose`` carries the batch)."""
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(self._delay_seconds, self._start)

    def _start(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self._run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        await self._send()

    def cancel(self) -> None:
        """Disarm the timer (the batch stays with the owner)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def wait(self) -> None:
        """Wait for the sends already started."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
