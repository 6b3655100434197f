"""The gateway queue: when every endpoint of a request's pool is at capacity, the
request waits in latgate, in priority order, instead of in the engine's arrival order.

Capacity is what latgate knows of each endpoint: the engine's own gauges
(:mod:`latgate.live.providers.monitor`), ``max_batch_size``, TileRT's free decode nodes, or
the running count seen when the engine answered busy. A pool with any endpoint of
unknown capacity has no queue: its requests go on at once, as before. A request that
finds a free slot, or a pool without a queue, costs one pass over its pool's endpoints.

A request that finds its pool full (:meth:`Admission.hold`):

1. is given a predicted wait (:mod:`latgate.routing.queue_outlook`): the slot that
   frees for the ``k+1``-th in line (``k`` waiting before it), from the slots' leases,
   at least what the capacity gives on a cold pool, times a correction per class
   learnt from the waits that came true;
2. waits when that fits its bound: a request with a budget must still meet it (time
   since it arrived + wait + the pool's TTFT p90 <= budget); one without, its class's
   longest wait (``[routing.queue] max_wait_ms``, ``batch_max_wait_ms``);
3. otherwise goes on at once to the candidates left when it has a budget and there are
   any (the fallbacks, else the overflow candidates; reason ``overflow:FROM``), else
   is answered 503 with ``Retry-After`` (the predicted wait, rounded up) now, never
   after a wait that could not work: a ``batch`` request is *shed*. An
   ``interactive`` request that would miss its budget first takes the slot of a
   ``batch`` request admitted but without its first byte yet (*preemption*:
   :mod:`latgate.routing.queue_preempt`), when ``preempt`` is on.

Waiting requests take freed slots in class order, fair shares of tokens between keys
(and sessions) inside a class, then earliest deadline (:class:`~latgate.routing.queue.WaitQueue`).
A slot freed (a request there ended, or a load read shows room) is reserved at once for
the waiter it goes to. A waiter whose slot comes too late for its budget goes on to the
candidates left instead; one whose bound runs out likewise, or gets 503. A request that
waited is routed with reason ``waited:FROM`` and ``X-Latgate-Queue-Ms``; waits are
counted in ``latgate_queue_wait_seconds{provider,priority,outcome}`` and
``latgate_queue_depth``, shown in ``/admin/providers`` (``queue``) and ``/ui``, and with
``X-Latgate-Debug: 1`` explained in ``X-Latgate-Admission``.

Nothing waits under a strategy other than ``latgate``, or with ``[routing.queue]
enabled = false`` or ``[routing] admission = false``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from latgate.foundation.config.schema import QueueConfig
from latgate.foundation.errors import Overloaded
from latgate.foundation.metrics import Metrics
from latgate.live.providers.endpoint import EndpointRuntime
from latgate.live.providers.pool import ProviderPool
from latgate.live.providers.runtime import ProviderRuntime
from latgate.routing.priority import BATCH, CLASS_NAMES, INTERACTIVE
from latgate.routing.queue import Waiter, WaitQueue
from latgate.routing.queue_outlook import WaitOutlook, batch_headroom, free_endpoint, has_room
from latgate.routing.queue_preempt import Preemptible
from latgate.routing.queue_refuse import elsewhere, fits_budget, shed_error
from latgate.routing.targets import RouteDecision

WAIT_P90_FACTOR = 1.25
"""A request with somewhere else to go waits only when this multiple of its predicted
wait fits: a wait is a gamble the overflow candidate does not ask for."""


@dataclass(slots=True)
class _Stats:
    """One provider's queue outcomes since start (``/admin/providers``; kept by a reload)."""

    admitted: int = 0
    overflow: int = 0
    shed: int = 0
    preempted: int = 0
    last_wait_ms: float | None = None


@dataclass(slots=True)
class Ask:
    """What the queue needs of a request beyond its decision.

    Attributes:
        priority: its class number (:mod:`latgate.routing.priority`).
        tenant: whose fair share it is charged to (key name, else client address).
        received_at: ``time.perf_counter()`` seconds when the gateway received it.
        cost_tokens: prompt plus expected completion tokens.
    """

    priority: int
    tenant: str
    received_at: float
    cost_tokens: int


class Admission:
    """One gateway queue per provider (see the module docstring).

    Args:
        pool: the providers and their endpoints; its ``slot_freed`` hook is taken.
        metrics: where waits, depths and outcomes are counted.
        settings: ``[routing.queue]``.
        enabled: strategy ``latgate`` with the queue on; off, :meth:`hold` returns every
            decision as it is.
        timer: seconds, the clock of :attr:`Ask.received_at` (``time.perf_counter``).
    """

    def __init__(
        self,
        *,
        pool: ProviderPool,
        metrics: Metrics,
        settings: QueueConfig,
        enabled: bool,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._pool = pool
        self._timer = timer
        self._metrics = metrics
        self.settings = settings
        self.enabled = enabled
        self.outlook = WaitOutlook(pool)
        self._queues = {name: WaitQueue(max_waiting=settings.max_waiting) for name in pool.providers}
        self._stats = {name: _Stats() for name in pool.providers}
        self._preemptible = {
            name: Preemptible(name, self._counter_of_preempted(name)) for name in pool.providers
        }
        if enabled:
            pool.slot_freed = self._freed
            for name in pool.providers:
                metrics.start_queue_series(name, CLASS_NAMES)

    async def hold(
        self, decision: RouteDecision, ask: Ask, *, explain: dict[str, str] | None = None
    ) -> tuple[RouteDecision, float | None]:
        """The decision to plan with, and the ms it waited (None: it found room).

        As it is when its pool has room or no known capacity; with its primary's reason
        ``waited:FROM`` once a slot was given to it; with the primary left out (reason
        ``overflow:FROM``) when it cannot wait within its budget and has candidates left.

        Raises:
            Overloaded: 503 with ``Retry-After`` (its predicted wait): it cannot wait
                within its bound and has nowhere else to go (a ``batch`` request:
                shed), or was shed from a full queue for a higher class.
        """
        if not self.enabled:
            return decision, None
        name = decision.provider
        queue = self._queues[name]
        runtime = self._pool[name]
        now = self._pool.clock()
        headroom = batch_headroom(runtime, self.settings.batch_headroom_slots) if ask.priority == BATCH else 0
        if not queue.waiting and has_room(self._pool, runtime, now, headroom):
            return decision, None
        view = self.outlook.view(runtime, decision.prompt_tokens, now, completion_tokens=max(0, ask.cost_tokens - decision.prompt_tokens))
        if view is None:
            return decision, None
        budget, elapsed_ms = decision.budget_ms, (self._timer() - ask.received_at) * 1000.0
        bound_ms = self._bound_ms(ask.priority, budget, elapsed_ms, view.ttft_ms)
        ahead = queue.ahead_of(ask.priority, ask.tenant, now + bound_ms / 1000.0)  # its share's and deadline's place
        if view.free > ahead + headroom:  # a slot none before it can take
            return decision, None
        stats = self._stats[name]
        klass = CLASS_NAMES[ask.priority]
        predicted_ms = self.outlook.predict_ms(view, ahead=ahead)  # from the leases alone
        wait_ms = shown_ms = self.outlook.corrected_ms(name, ask.priority, predicted_ms)
        if budget is not None and (len(decision.candidates) > 1 or decision.overflow):
            wait_ms *= WAIT_P90_FACTOR
        if wait_ms > bound_ms >= 0.0 and self._preempt(name, ask.priority, budget):
            # a slot frees as the preempted attempt is cancelled: no wait left (the bound
            # already keeps the first token's time); with no slack left, nothing is preempted
            wait_ms = 0.0
        if wait_ms > bound_ms:
            text = f"{name} wait {_ms(wait_ms)} > {_ms(max(0.0, bound_ms))} left"
            return self._refuse(decision, ask, explain, text, retry_ms=shown_ms, waited_s=0.0), None
        future: asyncio.Future[EndpointRuntime] = asyncio.get_running_loop().create_future()
        waiter = Waiter(
            priority=ask.priority, deadline=now + bound_ms / 1000.0, tenant=ask.tenant, cost_tokens=ask.cost_tokens,
            enqueued_at=now, handle=future,
        )  # fmt: skip
        out = queue.push(waiter)
        if out is waiter:
            text = f"{name} queue full ({len(queue)} waiting)"
            return self._refuse(decision, ask, explain, text, retry_ms=shown_ms, waited_s=0.0), None
        self._metrics.queue_depth_gauge(name, klass).inc()
        if out is not None:
            self._drop(name, out)
            message = f"shed from {name}'s queue for a request of a higher class"
            out.handle.set_exception(shed_error(message, self.retry_ms(name, out.priority)))
        started = self._timer()
        try:
            async with asyncio.timeout(max(0.0, bound_ms) / 1000.0):
                endpoint = await future
        except TimeoutError:
            waited_ms = (self._timer() - started) * 1000.0
            self._forget(queue, waiter)
            stats.last_wait_ms = waited_ms
            text = f"gave up on {name} after {_ms(waited_ms)} (predicted {_ms(wait_ms)})"
            return self._refuse(
                decision,
                ask,
                explain,
                text,
                retry_ms=self.retry_ms(name, ask.priority),
                waited_s=waited_ms / 1000.0,
            ), waited_ms
        except asyncio.CancelledError:  # the client left while waiting
            self._forget(queue, waiter)
            raise
        except Overloaded as shed:  # pushed out by a higher class
            stats.shed += 1
            self._metrics.record_queue_wait(
                provider=name, priority=klass, outcome="shed", seconds=self._timer() - started
            )
            raise shed from None
        waited = self._timer() - started
        waited_ms = waited * 1000.0
        self.outlook.learn(name, ask.priority, predicted_ms=predicted_ms, actual_ms=waited_ms)
        stats.last_wait_ms = waited_ms
        self._pool.release(endpoint)  # the slot held for it: the plan made now takes it
        if budget is not None and not fits_budget(
            elapsed_ms=elapsed_ms + waited_ms, wait_ms=0.0, ttft_ms=view.ttft_ms, budget_ms=budget
        ):
            self._wake(runtime)  # too late for its budget: the slot goes to the next waiter
            text = f"slot of {name} came after {_ms(waited_ms)}: too late for budget {budget}ms"
            return self._refuse(decision, ask, explain, text, retry_ms=0.0, waited_s=waited), waited_ms
        stats.admitted += 1
        self._metrics.record_queue_wait(provider=name, priority=klass, outcome="admitted", seconds=waited)
        if explain is not None:
            explain["admission"] = f"waited {_ms(waited_ms)} for {name} (predicted {_ms(wait_ms)}, {klass})"
        primary = dataclasses.replace(decision.candidates[0], reason=f"waited:{name}")
        return dataclasses.replace(
            decision, reason=primary.reason, candidates=(primary, *decision.candidates[1:])
        ), waited_ms

    def guard(self, provider: str, priority: int) -> Preemptible | None:
        """For a ``batch`` request about to be sent to ``provider`` (with preemption on):
        what to run its attempt in until its first byte (:meth:`Preemptible.run`), so an
        ``interactive`` request may take its slot; None for any other request."""
        if priority != BATCH or not self.enabled or not self.settings.preempt:
            return None
        return self._preemptible[provider]

    def may_requeue(self, ask: Ask) -> bool:
        """Whether a preempted request may go back to the queue: its class's longest
        wait is not over yet (the hold bounds the wait again)."""
        elapsed_ms = (self._timer() - ask.received_at) * 1000.0
        return self._bound_ms(ask.priority, None, elapsed_ms, 0.0) > 0.0

    def retry_ms(self, provider: str, priority: int) -> float:
        """The wait predicted now for a newcomer of class ``priority`` on ``provider``
        (ms; 0 when it has room or no known capacity): what ``Retry-After`` says."""
        runtime = self._pool[provider]
        view = self.outlook.view(runtime, 0, self._pool.clock())
        if view is None or view.free > len(self._queues[provider]):
            return 0.0
        predicted = self.outlook.predict_ms(view, ahead=self._queues[provider].ahead_of(priority))
        return self.outlook.corrected_ms(provider, priority, predicted)

    def describe(self) -> dict[str, dict[str, object]]:
        """Per provider: requests waiting now by class and the outcomes since start (for
        ``/admin/providers`` and ``/ui``)."""
        out: dict[str, dict[str, object]] = {}
        for name, queue in self._queues.items():
            stats = self._stats[name]
            waiting = {klass: 0 for klass in CLASS_NAMES}
            for waiter in queue.waiting:
                waiting[CLASS_NAMES[waiter.priority]] += 1
            out[name] = {
                "enabled": self.enabled,
                "waiting": len(queue),
                "waiting_by_priority": waiting,
                "admitted": stats.admitted,
                "overflow": stats.overflow,
                "shed": stats.shed,
                "preempted": stats.preempted,
                "last_wait_ms": None if stats.last_wait_ms is None else round(stats.last_wait_ms, 1),
                "wait_correction": {
                    CLASS_NAMES[k]: round(v, 3) for k, v in sorted(self.outlook.corrections[name].items())
                },
                "lease_ms": {
                    ep.config.id: round(self.lease_seconds(ep) * 1000.0, 1)
                    for ep in self._pool[name].endpoints
                },
            }
        return out

    def lease_seconds(self, endpoint: EndpointRuntime) -> float:
        """Seconds a request is expected to hold a slot: :meth:`WaitOutlook.lease_seconds`."""
        return self.outlook.lease_seconds(endpoint)

    def carry_from(self, previous: Admission) -> None:
        """Keep what ``previous`` (the admission of the gateway a reload replaces) counted
        and learnt: outcome counters, the wait correction and the observed leases, for
        the providers and endpoints still configured. Its waiters stay with it and take
        the slots its pool frees (:func:`latgate.live.providers.carry.carry_live_state`)."""
        for name, stats in previous._stats.items():
            if name in self._stats:
                self._stats[name] = dataclasses.replace(stats)
        self.outlook.carry_from(previous.outlook)

    # -- internals ---------------------------------------------------------------------

    def _counter_of_preempted(self, name: str) -> Callable[[], None]:
        def preempted() -> None:
            self._stats[name].preempted += 1
            self._metrics.record_queue_wait(provider=name, priority="batch", outcome="preempted", seconds=0.0)

        return preempted

    def _bound_ms(self, priority: int, budget: int | None, elapsed_ms: float, ttft_ms: float) -> float:
        """How long the request may still wait: its budget's slack, at most its class's
        longest wait."""
        settings = self.settings
        longest = settings.batch_max_wait_ms if priority == BATCH else settings.max_wait_ms
        bound = longest - elapsed_ms
        if budget is not None:
            bound = min(bound, budget - elapsed_ms - ttft_ms)
        return bound

    def _preempt(self, name: str, priority: int, budget: int | None) -> bool:
        """Cancel the newest preemptible ``batch`` attempt on ``name`` for an interactive
        request with a budget; True when one was cancelled."""
        if priority < INTERACTIVE or budget is None or not self.settings.preempt:
            return False
        return self._preemptible[name].preempt(priority=priority)

    def _refuse(
        self,
        decision: RouteDecision,
        ask: Ask,
        explain: dict[str, str] | None,
        text: str,
        *,
        retry_ms: float,
        waited_s: float,
    ) -> RouteDecision:
        """The request cannot wait: the candidates left when it has a budget and any are
        left, else :class:`Overloaded` (503, ``Retry-After`` from ``retry_ms``)."""
        name = decision.provider
        stats = self._stats[name]
        klass = CLASS_NAMES[ask.priority]
        rest = elsewhere(decision) if decision.budget_ms is not None else decision
        if rest is not decision:
            stats.overflow += 1
            self._metrics.record_queue_wait(
                provider=name, priority=klass, outcome="overflow", seconds=waited_s
            )
            if explain is not None:
                explain["admission"] = f"not held: {text}"
            return rest
        stats.shed += 1
        self._metrics.record_queue_wait(provider=name, priority=klass, outcome="shed", seconds=waited_s)
        raise shed_error(f"provider {name!r} is at capacity: {text}; {klass} request not queued", retry_ms)

    def _freed(self, runtime: ProviderRuntime, endpoint: EndpointRuntime, held_seconds: float | None) -> None:
        if held_seconds is not None and held_seconds > 0:
            self.outlook.observe_lease(endpoint, held_seconds)
        if self._queues[runtime.name].waiting:
            self._wake(runtime)

    def _wake(self, runtime: ProviderRuntime) -> None:
        """Slots of ``runtime`` may have freed: give each to the next waiter, reserved."""
        queue = self._queues[runtime.name]
        now = self._pool.clock()
        while queue.waiting:
            endpoint = free_endpoint(self._pool, runtime, now)
            if endpoint is None:
                return
            if queue.top_priority() == BATCH and not has_room(self._pool, runtime, now, batch_headroom(runtime, self.settings.batch_headroom_slots)):
                return  # the headroom is kept for the other classes
            waiter = queue.pop()
            assert waiter is not None
            self._metrics.queue_depth_gauge(runtime.name, CLASS_NAMES[waiter.priority]).dec()
            if waiter.handle.done():
                continue
            self._pool.reserve(endpoint)
            waiter.handle.set_result(endpoint)

    def _drop(self, name: str, waiter: Waiter) -> None:
        self._metrics.queue_depth_gauge(name, CLASS_NAMES[waiter.priority]).dec()

    def _forget(self, queue: WaitQueue, waiter: Waiter) -> None:
        """Drop a waiter that stopped waiting; a slot given to it meanwhile is passed on."""
        future = waiter.handle
        if queue.remove(waiter):
            name = next(name for name, q in self._queues.items() if q is queue)
            self._drop(name, waiter)
        if future.done() and not future.cancelled() and future.exception() is None:
            endpoint = future.result()
            self._pool.release(endpoint)
            runtime = next(r for r in self._pool.providers.values() if endpoint in r.endpoints)
            self._wake(runtime)
        else:
            future.cancel()


def _ms(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.0f}ms"
