"""Preemption before the first byte: a ``batch`` attempt whose client has received nothing
yet gives its slot to a request that would otherwise wait for one.

Each ``batch`` attempt on a provider with preemption on runs under
:meth:`Preemptible.run` until it returns (its first byte: nothing has reached the client
yet). A stream of a tenant with a ``batch`` backlog (its requests wait: it asks more than
it is served) is then *held*: its content is kept back, the upstream generating on, to
the stream's end, at most :data:`HELD_LEASES` leases of its provider (what a request is
seen to hold a slot), so it stays preemptible while it runs; the client gets its stream
when the hold ends, what was held at once. A non-streamed attempt is preemptible
until its answer comes. A stream whose keep-alive head went out
(:mod:`latgate.forwarding.keepalive`, ``first_token_keepalive_sec``) is never preempted,
and its hold ends.

When the gateway queue preempts (:meth:`Preemptible.preempt`), it cancels the attempt
:func:`~latgate.routing.queue.choose_preemption` picks (the youngest of the tenant
holding the most, least work lost), first among those whose slot frees at once: a held
stream's or a non-streamed attempt's upstream connection is closed, so the engine aborts
the generation and frees its slot (vLLM aborts a request whose client went away); a
stream cut before its first content has its connection drained briefly first
(:data:`latgate.transport.h1conn.DRAIN_SECONDS`). :meth:`run` raises :class:`Preempted`. The forwarder puts the request back in
the queue (:meth:`latgate.forwarding.forward.Forwarder.forward`), whose hold applies its
bounds as to any request (predicted wait against the slack left, count, longest wait):
where it would shed it, the request is answered at once 503 with ``Retry-After`` and
``x-latgate-preempted: 1`` (:func:`latgate.routing.queue_refuse.preempted_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

from latgate.foundation.errors import Overloaded
from latgate.routing.queue import choose_preemption

T = TypeVar("T")

HELD_LEASES = 2.0
"""A ``batch`` stream of a tenant with a backlog is held back (preemptible) to its end, at
most this many of its pool's leases."""


class Preempted(Overloaded):
    """A ``batch`` request whose slot went to another request before its first byte:
    503 with ``Retry-After`` and ``x-latgate-preempted: 1`` when it cannot wait again
    (as :meth:`Preemptible.run` raises it, the forwarder's signal to queue it again)."""

    code = "preempted"


@dataclass(slots=True, eq=False)
class _Running:
    tenant: str
    started_at: float
    early: Any  # the request's keep-alive head (EarlyHead), None without one
    closable: bool  # cutting it closes its upstream connection at once (the engine frees its slot now)
    relay: Any = None  # a held stream's relay
    cut: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Preemptible:
    """The ``batch`` attempts of one provider that may still give up their slot.

    Args:
        provider: the provider's name (for messages).
        on_preempted: called once per attempt preempted (counters, metrics).
        hold_seconds: for a tenant, the longest a stream of its is held back after its
            first content (0: not held); asked once per stream.
        timer: seconds (``time.perf_counter``): an attempt's start, for the youngest.
    """

    __slots__ = ("_hold_seconds", "_on_preempted", "_provider", "_running", "_timer")

    def __init__(
        self,
        provider: str,
        on_preempted: Callable[[], None],
        hold_seconds: Callable[[str], float] = lambda tenant: 0.0,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._provider = provider
        self._on_preempted = on_preempted
        self._hold_seconds = hold_seconds
        self._timer = timer
        self._running: list[_Running] = []

    def __len__(self) -> int:
        """Attempts that may be preempted now."""
        return sum(1 for entry in self._running if not _committed(entry.early))

    def closable(self) -> int:
        """Attempts that may be preempted now and whose engine slot frees at once when they
        are (a held stream, a non-streamed answer)."""
        return sum(1 for entry in self._running if entry.closable and not _committed(entry.early))

    def preempt(self, *, priority: int, tenant: str, backlogged: Collection[str]) -> bool:
        """For a request of class ``priority`` and ``tenant`` that needs a slot: cut the
        attempt :func:`~latgate.routing.queue.choose_preemption` picks among those whose
        client has received nothing (``backlogged``: the tenants with ``batch`` requests
        waiting), those whose engine slot frees at once first (a held stream, a
        non-streamed answer); True when one was cut (its slot frees as it unwinds)."""
        running = [entry for entry in self._running if not _committed(entry.early)]
        for group in ([entry for entry in running if entry.closable], running):
            index = choose_preemption(
                [(entry.tenant, entry.started_at) for entry in group], priority=priority, tenant=tenant, backlogged=backlogged
            )
            if index is not None:
                entry = group[index]
                self._running.remove(entry)
                entry.cut.set_result(None)
                if entry.relay is not None:  # now: the engine frees the slot as the request that cut it is sent
                    entry.relay.abort()
                return True
        return False

    async def run(self, attempt: Awaitable[T], exchange: Any, early: Any = None) -> T:
        """``await attempt`` (one ``batch`` attempt, until its first byte), then hold a
        stream of a tenant with a backlog (see the module docstring); raises
        :class:`Preempted` when its slot was taken (and marks ``exchange``, the request's
        record, ``preempted``). ``exchange.tenant`` is whose it is, ``exchange.stream``
        whether it streams; ``early``: the request's keep-alive head, whose having gone
        out makes it no longer preemptible."""
        task: asyncio.Task[T] = asyncio.ensure_future(attempt)
        entry = _Running(exchange.tenant, self._timer(), early, closable=not exchange.stream)
        self._running.append(entry)
        try:
            await asyncio.wait((task, entry.cut), return_when=asyncio.FIRST_COMPLETED)
            if entry.cut.done():
                preempted = self._preempted(exchange)
                await _cancelled(task)
                raise preempted
            result = task.result()
            hold = self._hold_seconds(exchange.tenant) if _is_stream(result) and not _committed(early) else 0.0
            if hold > 0.0 and entry in self._running:
                entry.closable, entry.relay = True, result
                if await _held(result, entry.cut, hold, early):
                    preempted = self._preempted(exchange)
                    await _discard(result)
                    raise preempted
            return result
        except asyncio.CancelledError:  # the client left
            await _cancelled(task)
            raise
        finally:
            if entry in self._running:
                self._running.remove(entry)

    def _preempted(self, exchange: Any) -> Preempted:
        exchange.queue_outcome = "preempted"
        self._on_preempted()
        return Preempted(
            f"preempted on {self._provider!r} before its first byte by a request that needed its slot; retry shortly",
            headers={"retry-after": "1", "x-latgate-preempted": "1"},
        )


async def _held(relay: Any, cut: asyncio.Future[None], seconds: float, early: Any) -> bool:
    """Read ``relay``'s upstream body into its head (through its tap, as the attempt read
    the events before the first content) until the stream's end, ``seconds``, ``cut``, or
    a read after ``early`` (its keep-alive head) went out; True when cut. A read still pending when the hold ends is handed to the relay. All
    of a stream held to its end goes out as one head: its time per token is then not
    sampled (no read came after the first content), never sampled from a burst."""
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + seconds
    tap = relay.tap
    body = relay.body
    while not tap.done and tap.error is None and not _committed(early):
        read = asyncio.ensure_future(anext(body))
        await asyncio.wait((read, cut), timeout=max(0.0, ends_at - loop.time()), return_when=asyncio.FIRST_COMPLETED)
        if cut.done():
            read.cancel()
            await asyncio.wait((read,))
            return True
        if not read.done():  # the hold is over: the relay takes the read on
            relay.body = _resumed(read, body)
            return False
        if read.cancelled() or read.exception() is not None:  # the end, or a failure the relay meets again
            return False
        out, units = tap.feed(read.result())
        relay.head += out
        relay.head_units += units
    return cut.done()


async def _resumed(read: asyncio.Future[bytes], body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``read``'s bytes, then the rest of ``body``."""
    try:
        yield await read
    except StopAsyncIteration:
        return
    async for data in body:
        yield data


def _is_stream(result: Any) -> bool:
    """A stream's relay, not yet sent (its head, tap, body, ``on_close`` and ``abort``:
    :class:`latgate.forwarding.relay.StreamRelay`), not a whole answer."""
    return callable(getattr(result, "on_close", None)) and hasattr(result, "tap")


async def _discard(result: Any) -> None:
    """Close a relay that will never be sent: its upstream connection at once (its
    ``abort``), so the engine aborts the generation, then its slot (``on_close``)."""
    if _is_stream(result):
        result.abort()
        with contextlib.suppress(Exception):
            await result.on_close()


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it to unwind (its slot and connection released); a
    relay it returned before the cancel took is closed unsent."""
    task.cancel()
    await asyncio.wait((task,))
    if not task.cancelled() and task.exception() is None:
        await _discard(task.result())


def _committed(early: Any) -> bool:
    """True when the response head already went out (a keep-alive stream: no preemption)."""
    return early is not None and early.committed
