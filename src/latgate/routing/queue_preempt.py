"""Preemption before the first byte: a ``batch`` attempt gives its slot to an
``interactive`` request that would otherwise miss its budget.

Each ``batch`` attempt on a provider with preemption on runs under a :class:`Guard`
until it returns (its first byte: nothing has reached the client yet). When the gateway
queue preempts one (:meth:`Preemptible.preempt`: the most recently admitted,
:func:`~latgate.routing.queue.choose_preemption`), its task is cancelled, which frees its
slot for the interactive request, and the guard raises :class:`Preempted`. The
forwarder then puts the request back in the queue when its own bound still allows
(:meth:`latgate.forwarding.forward.Forwarder.forward`), else it is answered 503 with
``Retry-After`` and ``x-latgate-preempted: 1``. A stream whose response head already
went out (a keep-alive stream) is never preempted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from latgate.foundation.errors import Overloaded
from latgate.routing.priority import BATCH
from latgate.routing.queue import choose_preemption

T = TypeVar("T")


class Preempted(Overloaded):
    """A ``batch`` request whose slot went to an ``interactive`` one before its first
    byte: 503 with ``Retry-After`` and ``x-latgate-preempted: 1`` (when it cannot wait
    again)."""

    code = "preempted"


@dataclass(slots=True, eq=False)
class _Running:
    admitted_at: float
    task: asyncio.Task[Any]
    exchange: Any
    early: Any  # the request's keep-alive head (EarlyHead), None without one


class Preemptible:
    """The ``batch`` attempts of one provider that may still give up their slot.

    Args:
        provider: the provider's name (for messages).
        on_preempted: called once per attempt preempted (counters, metrics).
    """

    __slots__ = ("_on_preempted", "_provider", "_running")

    def __init__(self, provider: str, on_preempted: Callable[[], None]) -> None:
        self._provider = provider
        self._on_preempted = on_preempted
        self._running: list[_Running] = []

    def preempt(self, *, priority: int) -> bool:
        """For a request of class ``priority``: cancel the most recently admitted ``batch``
        attempt whose response head has not gone out; True when one was cancelled (its
        slot frees as it ends). Never for a ``batch`` request."""
        running = [entry for entry in self._running if not _committed(entry.early)]
        index = choose_preemption([(BATCH, entry.admitted_at) for entry in running], priority=priority)
        if index is None:
            return False
        entry = running[index]
        self._running.remove(entry)
        entry.task.cancel("latgate: preempted")
        return True

    async def run(self, attempt: Awaitable[T], exchange: Any, early: Any = None) -> T:
        """``await attempt`` (one ``batch`` attempt, until its first byte); raises
        :class:`Preempted` when its slot was taken (and marks ``exchange``, the request's
        record, ``preempted``). ``early``: the request's keep-alive head, whose having gone
        out makes the attempt no longer preemptible."""
        task: asyncio.Task[T] = asyncio.ensure_future(attempt)
        entry = _Running(time.perf_counter(), task, exchange, early)
        self._running.append(entry)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and not _cancelling(asyncio.current_task()):
                exchange.queue_outcome = "preempted"
                self._on_preempted()
                raise Preempted(
                    f"preempted on {self._provider!r} before its first byte by an interactive request; retry shortly",
                    headers={"retry-after": "1", "x-latgate-preempted": "1"},
                ) from None
            task.cancel()
            raise
        finally:
            if entry in self._running:
                self._running.remove(entry)


def _committed(early: Any) -> bool:
    """True when the response head already went out (a keep-alive stream: no preemption)."""
    return early is not None and early.committed


def _cancelling(task: asyncio.Task[Any] | None) -> bool:
    return task is not None and task.cancelling() > 0
