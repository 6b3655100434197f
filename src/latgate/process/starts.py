"""Request starts spread over event-loop turns, newest first in a burst.

When a thousand streams arrive at once, each request's first step (reading its body,
routing, opening the upstream connection) runs on the one event loop. asyncio runs
every ready task once per loop turn, so a request that arrives in the burst needs its
few turns while each turn carries the first steps of all the others: it waits for the
whole burst's start-up work, though its own is a small share of it.

:class:`StartGate` lets at most :data:`STARTS_PER_TURN` requests begin per loop turn;
the rest wait, and when more are waiting than that, the newest begins first (the
adaptive LIFO of overloaded RPC servers: under a burst the latest arrival is the one
whose client is still waiting; the oldest wait for the burst to clear instead of
everyone waiting for all of it). A request that finds no queue begins at once, in its
own turn, so outside a burst nothing is delayed. Requests already running (streams
relaying events) are never held: the gate is only at a request's start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

#: Requests that may begin in one event-loop turn; the rest wait for the next turns.
STARTS_PER_TURN = 16

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class StartGate:
    """An ASGI wrapper: ``http`` requests begin at most ``per_turn`` per loop turn,
    the newest waiting first; other scopes (lifespan) pass straight through.

    Args:
        app: the ASGI app.
        per_turn: requests begun per loop turn (at least 1).

    Attributes:
        waiting: requests held at the gate now.
    """

    def __init__(self, app: ASGIApp, *, per_turn: int = STARTS_PER_TURN) -> None:
        self.app = app
        self.per_turn = max(1, per_turn)
        self._begun = 0  # in the current turn
        self._turn_pending = False
        self._stack: list[asyncio.Future[None]] = []

    def __getattr__(self, name: str) -> Any:  # app.state and the like
        return getattr(self.app, name)

    @property
    def waiting(self) -> int:
        return len(self._stack)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self.turn()
        await self.app(scope, receive, send)

    async def turn(self) -> None:
        """Return when this request may begin: at once while this turn has room and
        nobody waits, else when a later turn takes it (newest first)."""
        if not self._stack and self._begun < self.per_turn:
            self._count()
            return
        future = asyncio.get_running_loop().create_future()
        self._stack.append(future)
        self._schedule()
        try:
            await future
        except asyncio.CancelledError:
            if future in self._stack:
                self._stack.remove(future)
            raise

    def _count(self) -> None:
        self._begun += 1
        self._schedule()

    def _schedule(self) -> None:
        if not self._turn_pending:
            self._turn_pending = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        # runs once in the next loop turn: the quota restarts and the newest waiting begin
        self._turn_pending = False
        self._begun = 0
        stack = self._stack
        while stack and self._begun < self.per_turn:
            future = stack.pop()
            if not future.done():
                future.set_result(None)
                self._begun += 1
        if stack or self._begun:
            self._schedule()
