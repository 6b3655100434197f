"""The gateway queue: when every endpoint of a request's pool is at capacity, the
request waits in latgate, in priority order, instead of in the engine's arrival order.

Capacity is what latgate knows of each endpoint: the engine's own gauges
(:mod:`latgate.live.providers.monitor`), ``max_batch_size``, TileRT's free decode nodes, or
the running count seen when the engine answered busy. A pool with any endpoint of
unknown capacity has no queue: its requests go on at once, as before. A request that
finds a free slot, or a pool without a queue, costs one pass over its pool's endpoints.
A ``batch`` request leaves the last ``batch_headroom_slots`` free slots to the others,
less the running ``batch`` attempts that would give theirs up at once (preemption).

A request that finds its pool full (:meth:`Admission.hold`):

1. is given a predicted wait (:mod:`latgate.routing.queue_outlook`) and a bound: a
   request with a budget and somewhere else to go, or of class ``batch``, must still
   meet it (time since it arrived + wait + the pool's TTFT p90 <= budget); any other,
   its class's longest wait (``[routing.queue] max_wait_ms``, ``batch_max_wait_ms``):
   a budget is a preference, so with nowhere else to go it waits in its deadline's
   place and is served *late* (reason ``late:FROM``) if its slot comes after it;
2. with ``preempt`` on, takes at once the slot of a running ``batch`` attempt whose
   client has received nothing yet (:mod:`latgate.routing.queue_preempt`), when it is
   of a class above ``batch``, or a ``batch`` request of a tenant within its fair share
   (its equal part of the slots ahead of the others' service at most) while another
   tenant has a backlog; the request goes on at once (reason ``waited:FROM``, 0 ms): no
   await lies between the cut and its attempt taking the slot, so the slot freed as the
   cut attempt unwinds is not given to a waiter meanwhile. The cut one asks again
   (:attr:`Ask.preempted`): these steps, with 503 ``x-latgate-preempted`` for a shed;
3. else waits when its predicted wait fits its bound;
4. else goes on at once to the candidates left when it has a budget and there are any
   (the fallbacks, else the overflow candidates; reason ``overflow:FROM``), else is
   answered 503 with ``Retry-After`` (the predicted wait, rounded up) now, never after a
   wait that could not work (``batch``: *shed*; any other: past its class's longest wait).

Waiting requests take freed slots in class order, fair shares of tokens between keys
(and sessions) inside a class, then earliest deadline (:class:`~latgate.routing.queue.WaitQueue`).
A slot freed (a request there ended, or a load read shows room) is reserved at once for
the waiter it goes to. A waiter whose slot comes too late for its budget goes on to the
candidates left instead (or, served late, takes it); one whose bound runs out likewise,
or gets 503. A request that waited is routed with reason ``waited:FROM`` (``late:FROM``)
and ``X-Latgate-Queue-Ms``; waits are counted in ``latgate_queue_wait_seconds`` and
``latgate_queue_depth``, shown in ``/admin/providers`` and ``/ui``, and explained in
``X-Latgate-Admission`` (``X-Latgate-Debug: 1``). Nothing waits under a strategy other
than ``latgate``, or with ``[routing.queue] enabled = false`` or ``admission = false``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from latgate.foundation.config.schema import QueueConfig
from latgate.foundation.errors import Overloaded
from latgate.foundation.metrics import Metrics
from latgate.live.providers.endpoint import EndpointRuntime
from latgate.live.providers.pool import ProviderPool
from latgate.live.providers.runtime import ProviderRuntime
from latgate.routing import queue_refuse
from latgate.routing.priority import BATCH, CLASS_NAMES
from latgate.routing.queue import Place, Waiter, WaitQueue
from latgate.routing.queue_outlook import WaitOutlook, batch_headroom, free_endpoint, has_room
from latgate.routing.queue_preempt import HELD_LEASES, Preemptible
from latgate.routing.queue_refuse import fits_budget, ms_text, preempted_error, refuse, served_late
from latgate.routing.queue_stats import QueueStats, queue_state
from latgate.routing.targets import RouteDecision

WAIT_P90_FACTOR = 1.25
"""A request with somewhere else to go waits only when this multiple of its predicted
wait fits: a wait is a gamble the overflow candidate does not ask for."""


@dataclass(slots=True)
class Ask:
    """What the queue needs of a request beyond its decision.

    Attributes:
        priority: its class number (:mod:`latgate.routing.priority`).
        tenant: whose fair share it is charged to (key name, else client address).
        received_at: ``time.perf_counter()`` seconds when the gateway received it.
        cost_tokens: prompt plus expected completion tokens.
        preempted: it was cut before its first byte and asks again: when it cannot wait
            (its bound, the queue's count, a higher class pushing it out), the answer is
            :class:`~latgate.routing.queue_preempt.Preempted` at once, never a shed.
    """

    priority: int
    tenant: str
    received_at: float
    cost_tokens: int
    preempted: bool = False


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
        self._stats = {name: QueueStats() for name in pool.providers}
        self._preemptible = {
            name: Preemptible(name, partial(self._count_preempted, name), partial(self._hold_seconds, name), timer)
            for name in pool.providers
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
        ``waited:FROM`` once a slot was given to it (at once when it preempted a
        ``batch`` attempt for it), ``late:FROM`` when that slot came after its budget and
        it had nowhere else to go; with the primary left out (reason ``overflow:FROM``)
        when it cannot wait within its budget and has candidates left.

        Raises:
            Overloaded: 503 with ``Retry-After`` (its predicted wait): it cannot wait
                within its bound (a ``batch`` request's budget, else its class's longest
                wait) and has nowhere else to go, or was shed from a full queue (its count)
                for a higher class. ``Preempted``: an ask preempted that it cannot take back.
        """
        if not self.enabled:
            return decision, None
        name = decision.provider
        queue, runtime, now = self._queues[name], self._pool[name], self._pool.clock()
        headroom = self._headroom(runtime) if ask.priority == BATCH else 0
        if not queue.waiting and has_room(self._pool, runtime, now, headroom):
            return decision, None
        place = self._place(decision, ask, now, headroom)
        if place is None:  # a slot none before it can take, or no known capacity
            return decision, None
        waiter = Waiter(
            priority=ask.priority, deadline=now + place.deadline_ms / 1000.0, tenant=ask.tenant, cost_tokens=ask.cost_tokens,
            enqueued_at=now, handle=asyncio.get_running_loop().create_future(),
        )  # fmt: skip
        if place.deadline_ms >= 0.0 and self._preempt(name, ask, place.slots):  # not for one late anyway
            if ask.priority == BATCH:
                queue.charge(waiter)  # the slot is its share's
            return self._admitted(decision, ask, None, place, 0.0, explain), 0.0
        if place.wait_ms > place.bound_ms:
            text = f"{name} wait {ms_text(place.wait_ms)} > {ms_text(max(0.0, place.bound_ms))} left"
            return self._refuse(decision, ask, explain, text, retry_ms=place.shown_ms, waited_s=0.0), None
        out = queue.push(waiter)
        if out is waiter:
            text = f"{name} queue full ({len(queue)} waiting)"
            return self._refuse(decision, ask, explain, text, retry_ms=place.shown_ms, waited_s=0.0), None
        self._metrics.queue_depth_gauge(name, CLASS_NAMES[ask.priority]).inc()
        if out is not None:
            self._drop(name, out)
            message = f"shed from {name}'s queue for a request of a higher class"
            out.handle.set_exception(queue_refuse.shed_error(message, self.retry_ms(name, out.priority)))
        return await self._wait(decision, ask, waiter, place, explain)

    def _place(self, decision: RouteDecision, ask: Ask, now: float, headroom: int) -> Place | None:
        """Where a request that found no room it may take stands: its bound, and its wait
        predicted from the leases of the slots ahead of it; None when a slot is free for
        it after all (none before it can take it) or a capacity is unknown."""
        name = decision.provider
        view = self.outlook.view(self._pool[name], decision.prompt_tokens, now, completion_tokens=max(0, ask.cost_tokens - decision.prompt_tokens))
        if view is None:
            return None
        elapsed_ms, late = (self._timer() - ask.received_at) * 1000.0, served_late(decision, ask.priority)
        deadline_ms = queue_refuse.wait_bound_ms(self.settings, ask.priority, decision.budget_ms, elapsed_ms, view.ttft_ms)
        bound_ms = queue_refuse.wait_bound_ms(self.settings, ask.priority, None, elapsed_ms, 0.0) if late else deadline_ms
        ahead = self._queues[name].ahead_of(ask.priority, ask.tenant, now + deadline_ms / 1000.0)  # its share's and deadline's place
        if view.free > ahead + headroom:
            return None
        predicted_ms = self.outlook.predict_ms(view, ahead=ahead)  # from the leases alone
        wait_ms = shown_ms = self.outlook.corrected_ms(name, ask.priority, predicted_ms)
        if decision.budget_ms is not None and (len(decision.candidates) > 1 or decision.overflow):
            wait_ms *= WAIT_P90_FACTOR
        return Place(view.ttft_ms, elapsed_ms, bound_ms, predicted_ms, wait_ms, shown_ms, view.slots, deadline_ms, late)

    async def _wait(
        self, decision: RouteDecision, ask: Ask, waiter: Waiter, place: Place, explain: dict[str, str] | None
    ) -> tuple[RouteDecision, float | None]:
        """Wait for the slot ``waiter`` is given (within its bound), then as :meth:`hold` says."""
        name = decision.provider
        stats = self._stats[name]
        started = self._timer()
        try:
            async with asyncio.timeout(max(0.0, place.bound_ms) / 1000.0):
                endpoint = await waiter.handle
        except TimeoutError:
            waited_ms = (self._timer() - started) * 1000.0
            self._forget(name, waiter)
            stats.last_wait_ms = waited_ms
            text = f"gave up on {name} after {ms_text(waited_ms)} (predicted {ms_text(place.wait_ms)})"
            retry_ms = self.retry_ms(name, ask.priority)
            return self._refuse(decision, ask, explain, text, retry_ms=retry_ms, waited_s=waited_ms / 1000.0), waited_ms
        except asyncio.CancelledError:  # the client left while waiting
            self._forget(name, waiter)
            raise
        except Overloaded as shed:  # pushed out by a higher class
            if ask.preempted:  # its cut was counted
                why = "was pushed out of the queue for a higher class"
                raise preempted_error(name, why, self.retry_ms(name, ask.priority)) from None
            stats.shed += 1
            seconds = self._timer() - started
            self._metrics.record_queue_wait(provider=name, priority=CLASS_NAMES[ask.priority], outcome="shed", seconds=seconds)
            raise shed from None
        waited = self._timer() - started
        return self._admitted(decision, ask, endpoint, place, waited, explain), waited * 1000.0

    def _admitted(
        self,
        decision: RouteDecision,
        ask: Ask,
        endpoint: EndpointRuntime | None,
        place: Place,
        waited: float,
        explain: dict[str, str] | None,
    ) -> RouteDecision:
        """A waiter given ``endpoint``'s slot after ``waited`` seconds (None: the slot of
        the attempt it preempted, at once): the decision it goes on with (reason
        ``waited:FROM``), or the candidates left when the slot came too late."""
        name = decision.provider
        stats, klass, waited_ms = self._stats[name], CLASS_NAMES[ask.priority], waited * 1000.0
        stats.last_wait_ms = waited_ms
        if endpoint is not None:  # (a preemption is no outcome of the wait prediction)
            self.outlook.learn(name, ask.priority, predicted_ms=place.predicted_ms, actual_ms=waited_ms)
            self._pool.release(endpoint)  # the slot held for it: the plan made now takes it
        budget = decision.budget_ms
        on_time = budget is None or fits_budget(elapsed_ms=place.elapsed_ms + waited_ms, wait_ms=0.0, ttft_ms=place.ttft_ms, budget_ms=budget)
        if not on_time and not place.late:
            self._wake(self._pool[name])  # too late for its budget: the slot goes to the next waiter
            text = f"slot of {name} came after {ms_text(waited_ms)}: too late for budget {budget}ms"
            return self._refuse(decision, ask, explain, text, retry_ms=0.0, waited_s=waited)
        outcome = "admitted" if on_time else "late"  # late: its budget predicted missed, nowhere else to go
        stats.admitted, stats.late = stats.admitted + on_time, stats.late + (not on_time)
        self._metrics.record_queue_wait(provider=name, priority=klass, outcome=outcome, seconds=waited)
        if explain is not None:
            how = f"waited {ms_text(waited_ms)} for" if endpoint is not None else "preempted a batch request on"
            explain["admission"] = f"{how} {name} (predicted {ms_text(place.wait_ms)}, {klass}{'' if on_time else ', late'})"
        primary = dataclasses.replace(decision.candidates[0], reason=f"{'waited' if on_time else 'late'}:{name}")
        return dataclasses.replace(decision, reason=primary.reason, candidates=(primary, *decision.candidates[1:]))

    def guard(self, provider: str, priority: int) -> Preemptible | None:
        """For a ``batch`` request about to be sent to ``provider`` (with preemption on):
        what to run its attempt in until its first byte (:meth:`Preemptible.run`), so a
        request that would wait may take its slot; None for any other request."""
        if priority != BATCH or not self.enabled or not self.settings.preempt:
            return None
        return self._preemptible[provider]

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
        ``/admin/providers`` and ``/ui``: :func:`~latgate.routing.queue_stats.queue_state`)."""
        return {
            name: queue_state(
                enabled=self.enabled, queue=queue, stats=self._stats[name], corrections=self.outlook.corrections[name],
                lease_ms={ep.config.id: self.lease_seconds(ep) * 1000.0 for ep in self._pool[name].endpoints},
            )
            for name, queue in self._queues.items()
        }

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

    def _count_preempted(self, name: str) -> None:
        self._stats[name].preempted += 1
        self._metrics.record_queue_wait(provider=name, priority="batch", outcome="preempted", seconds=0.0)

    def _hold_seconds(self, name: str, tenant: str) -> float:
        """A ``batch`` stream of ``tenant`` is held preemptible while the tenant has a
        backlog on ``name``: to its end, at most :data:`HELD_LEASES` of the pool's lease."""
        if not self._queues[name].waiting_of(BATCH, tenant):
            return 0.0
        return HELD_LEASES * max((self.lease_seconds(ep) for ep in self._pool[name].endpoints), default=0.0)

    def _preempt(self, name: str, ask: Ask, slots: int) -> bool:
        """Cut a running ``batch`` attempt on ``name`` for ``ask`` instead of letting it wait:
        for a request of a class above ``batch``, or for a ``batch`` one of a tenant within
        its share (:meth:`WaitQueue.within_share`, with a burst of its equal part of the
        pool's ``slots``) while another has a backlog (:mod:`latgate.routing.queue_preempt`);
        True when one was cut."""
        if not self.settings.preempt:
            return False
        queue = self._queues[name]
        tenants = queue.backlogged(BATCH) | {ask.tenant}  # a burst up to its equal part of the slots
        burst_tokens = ask.cost_tokens * max(0, slots // len(tenants) - 1)
        if ask.priority == BATCH and not queue.within_share(BATCH, ask.tenant, burst_tokens):
            return False
        return self._preemptible[name].preempt(priority=ask.priority, tenant=ask.tenant, backlogged=queue.backlogged(BATCH))

    def _refuse(
        self, decision: RouteDecision, ask: Ask, explain: dict[str, str] | None, text: str, *, retry_ms: float, waited_s: float
    ) -> RouteDecision:
        """The request cannot wait: :func:`~latgate.routing.queue_refuse.refuse`."""
        return refuse(
            decision, priority=ask.priority, stats=self._stats[decision.provider], metrics=self._metrics, explain=explain,
            text=text, retry_ms=retry_ms, waited_s=waited_s, preempted=ask.preempted,
        )  # fmt: skip

    def _freed(self, runtime: ProviderRuntime, endpoint: EndpointRuntime, held_seconds: float | None) -> None:
        if held_seconds is not None and held_seconds > 0:
            self.outlook.observe_lease(endpoint, held_seconds)
        if self._queues[runtime.name].waiting:
            self._wake(runtime)

    def _wake(self, runtime: ProviderRuntime) -> None:
        """Slots of ``runtime`` may have freed: give each, reserved, to the next waiter."""
        queue = self._queues[runtime.name]
        now = self._pool.clock()
        while queue.waiting:
            endpoint = free_endpoint(self._pool, runtime, now)
            if endpoint is None:
                return
            waiter = self._next_waiter(runtime, now)
            if waiter is None:
                return  # the headroom is kept for the other classes
            if waiter.handle.done():
                continue
            self._pool.reserve(endpoint)
            waiter.handle.set_result(endpoint)

    def _headroom(self, runtime: ProviderRuntime) -> int:
        """Free slots of ``runtime`` a ``batch`` request leaves: ``batch_headroom_slots``
        less the running ``batch`` attempts that would give theirs up at once (preempt on)."""
        headroom = batch_headroom(runtime, self.settings.batch_headroom_slots)
        if self.settings.preempt and headroom:
            return max(0, headroom - self._preemptible[runtime.name].closable())
        return headroom

    def _next_waiter(self, runtime: ProviderRuntime, now: float) -> Waiter | None:
        """The queued waiter a free slot of ``runtime`` goes to (out of the queue), or None:
        a ``batch`` one when only the headroom is free."""
        queue = self._queues[runtime.name]
        if queue.top_priority() == BATCH and not has_room(self._pool, runtime, now, self._headroom(runtime)):
            return None
        waiter = queue.pop()
        if waiter is not None:
            self._drop(runtime.name, waiter)
        return waiter

    def _drop(self, name: str, waiter: Waiter) -> None:
        self._metrics.queue_depth_gauge(name, CLASS_NAMES[waiter.priority]).dec()

    def _forget(self, name: str, waiter: Waiter) -> None:
        """Drop a waiter that stopped waiting; a slot given to it meanwhile is passed on."""
        future = waiter.handle
        if self._queues[name].remove(waiter):
            self._drop(name, waiter)
        if future.done() and not future.cancelled() and future.exception() is None:
            self._pool.release(future.result())
            self._wake(self._pool[name])
        else:
            future.cancel()
