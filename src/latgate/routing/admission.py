"""The gateway queue: when every endpoint of a request's pool is at capacity, the
request waits in latgate, in priority order, instead of in the engine's arrival order.

Capacity is what latgate knows of each endpoint: the engine's own gauges
(:mod:`latgate.providers.monitor`), ``max_batch_size``, TileRT's free decode nodes, or
the running count seen when the engine answered busy. A pool with any endpoint of
unknown capacity has no queue: its requests go on at once, as before. A request that
finds a free slot, or a pool without a queue, costs one pass over its pool's endpoints.

A request that finds its pool full (:meth:`Admission.hold`):

1. is given a predicted wait: the slots' leases, each lasting what a request has been
   seen to hold a slot there (a recency-weighted mean; before any, the fitted TTFT
   plus the expected completion tokens times the learned time per token), minus its
   age, the slot for the ``k+1``-th in line (``k`` waiting before it) and whole leases
   per further round (:func:`~latgate.routing.queue.predicted_wait_ms`), times a
   correction per class learnt from the waits that came true (at least 1:
   :func:`~latgate.routing.queue.correction`);
2. waits when that fits its bound: a request with a budget must still meet it (time
   since it arrived + wait + the pool's TTFT p90 <= budget); one without, its class's
   longest wait (``[routing.queue] max_wait_ms``, ``batch_max_wait_ms``);
3. otherwise goes on at once to the candidates left when it has a budget and there are
   any (the fallbacks, else the overflow candidates; reason ``overflow:FROM``), else
   is answered 503 with ``Retry-After`` now, never after a wait that could not work:
   a ``batch`` request is *shed*. An ``interactive`` request that would miss its budget
   first takes the slot of a ``batch`` request admitted but without its first byte
   yet (*preemption*: :meth:`Admission.guard`; that one is answered 503 with
   ``x-latgate-preempted``), when ``preempt`` is on.

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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from latgate.config.schema import QueueConfig
from latgate.errors import GatewayError, Overloaded
from latgate.metrics import Metrics
from latgate.providers.endpoint import EndpointRuntime
from latgate.providers.pool import ProviderPool
from latgate.providers.runtime import ProviderRuntime
from latgate.routing.priority import BATCH, CLASS_NAMES, INTERACTIVE
from latgate.routing.queue import Waiter, WaitQueue, choose_preemption, correction, predicted_wait_ms
from latgate.routing.targets import RouteDecision, Target

T = TypeVar("T")
LEASE_EWMA_ALPHA = 0.2
MIN_CHECKED_WAIT_MS = 20.0
"""Waits predicted shorter than this do not teach the correction."""
WAIT_P90_FACTOR = 1.25
"""A request with somewhere else to go waits only when this multiple of its predicted
wait fits: a wait is a gamble the overflow candidate does not ask for."""


def fits_budget(*, elapsed_ms: float, wait_ms: float, ttft_ms: float, budget_ms: float) -> bool:
    """True when a request ``elapsed_ms`` after its arrival, waiting ``wait_ms`` and then
    ``ttft_ms`` to its first token, meets its budget."""
    return elapsed_ms + wait_ms + ttft_ms <= budget_ms


def overflow_targets(rest: Sequence[Target], decision: RouteDecision, full: str) -> list[Target]:
    """Where a request goes when provider ``full`` has no free slot: the candidates left
    (``rest``, else the decision's overflow candidates not among its candidates), each
    with the reason ``overflow:FULL``."""
    if not rest:
        seen = {t.provider for t in decision.candidates} | {full}
        rest = [t for t in decision.overflow if t.provider not in seen]
    reason = f"overflow:{full}"
    return [dataclasses.replace(t, reason=reason) for t in rest]


class Preempted(Overloaded):
    """A ``batch`` request whose slot went to an ``interactive`` one before its first
    byte: 503 with ``Retry-After`` and ``x-latgate-preempted: 1``."""

    code = "preempted"


@dataclass(slots=True)
class _Stats:
    """One provider's queue outcomes since start (``/admin/providers``)."""

    admitted: int = 0
    overflow: int = 0
    shed: int = 0
    preempted: int = 0
    last_wait_ms: float | None = None
    correction: dict[int, float] = field(default_factory=dict)  # class -> the wait prediction's multiplier, from outcomes
    running: list[tuple[int, float, asyncio.Task[Any], Any, Any]] = field(default_factory=list)  # preemptible: before first byte


@dataclass(slots=True)
class Ask:
    """What the queue needs of a request beyond its decision.

    Attributes:
        priority: its class number (:mod:`latgate.routing.priority`).
        tenant: whose fair share it is charged to (key name, session).
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
        self, *, pool: ProviderPool, metrics: Metrics, settings: QueueConfig, enabled: bool, timer: Callable[[], float] = time.perf_counter
    ) -> None:
        self._pool = pool
        self._timer = timer
        self._metrics = metrics
        self.settings = settings
        self.enabled = enabled
        self._queues = {name: WaitQueue(max_waiting=settings.max_waiting) for name in pool.providers}
        self._stats = {name: _Stats() for name in pool.providers}
        self._lease_seconds: dict[str, float] = {}  # endpoint key -> observed time a request holds a slot
        if enabled:
            pool.slot_freed = self._freed

    async def hold(self, decision: RouteDecision, ask: Ask, *, explain: dict[str, str] | None = None) -> tuple[RouteDecision, float | None]:
        """The decision to plan with, and the ms it waited (None: it found room).

        As it is when its pool has room or no known capacity; with its primary's reason
        ``waited:FROM`` once a slot was given to it; with the primary left out (reason
        ``overflow:FROM``) when it cannot wait within its budget and has candidates left.

        Raises:
            Overloaded: 503 with ``Retry-After``: it cannot wait within its bound and
                has nowhere else to go (a ``batch`` request: shed), or was shed from a
                full queue for a higher class.
        """
        if not self.enabled:
            return decision, None
        name = decision.provider
        queue = self._queues[name]
        runtime = self._pool[name]
        now = self._pool.clock()
        if not queue.waiting and _has_room(self._pool, runtime, now):
            return decision, None
        outlook = self._outlook(runtime, decision.prompt_tokens, now)
        if outlook is None:
            return decision, None
        free, remaining_ms, ttft_ms, lease_ms = outlook
        if free > len(queue):
            return decision, None
        stats = self._stats[name]
        klass = CLASS_NAMES[ask.priority]
        ahead = queue.ahead_of(ask.priority)
        predicted_ms = predicted_wait_ms(remaining_ms, ahead=ahead, lease_ms=lease_ms)  # from the leases alone
        wait_ms = predicted_ms * stats.correction.get(ask.priority, 1.0)
        elapsed_ms = (self._timer() - ask.received_at) * 1000.0
        budget = decision.budget_ms
        if budget is not None and (len(decision.candidates) > 1 or decision.overflow):
            wait_ms *= WAIT_P90_FACTOR
        bound_ms = self._bound_ms(ask.priority, budget, elapsed_ms, ttft_ms)
        if wait_ms > bound_ms >= 0.0 and self._preempt(name, ask.priority, budget):
            # a slot frees as the preempted attempt is cancelled: no wait left (the bound
            # already keeps the first token's time); with no slack left, nothing is preempted
            wait_ms = 0.0
        if wait_ms > bound_ms:
            text = f"{name} wait {_ms(wait_ms)} > {_ms(max(0.0, bound_ms))} left"
            return self._refuse(decision, ask, explain, text, wait_ms=wait_ms, waited_s=0.0), None
        future: asyncio.Future[EndpointRuntime] = asyncio.get_running_loop().create_future()
        waiter = Waiter(
            priority=ask.priority, deadline=now + bound_ms / 1000.0, tenant=ask.tenant, cost_tokens=ask.cost_tokens,
            enqueued_at=now, handle=future,
        )  # fmt: skip
        out = queue.push(waiter)
        if out is waiter:
            text = f"{name} queue full ({len(queue)} waiting)"
            return self._refuse(decision, ask, explain, text, wait_ms=wait_ms, waited_s=0.0), None
        self._metrics.queue_depth_gauge(name, klass).inc()
        if out is not None:
            self._drop(name, out)
            out.handle.set_exception(_shed(f"shed from {name}'s queue for a request of a higher class", wait_ms))
        started = self._timer()
        try:
            async with asyncio.timeout(max(0.0, bound_ms) / 1000.0):
                endpoint = await future
        except TimeoutError:
            waited = self._timer() - started
            self._forget(queue, waiter)
            stats.last_wait_ms = waited * 1000.0
            return self._refuse(decision, ask, explain, f"gave up on {name} after {_ms(waited * 1000.0)} (predicted {_ms(wait_ms)})", wait_ms=wait_ms, waited_s=waited), waited * 1000.0
        except asyncio.CancelledError:  # the client left while waiting
            self._forget(queue, waiter)
            raise
        except Overloaded as shed:  # pushed out by a higher class
            waited = self._timer() - started
            stats.shed += 1
            self._metrics.record_queue_wait(provider=name, priority=klass, outcome="shed", seconds=waited)
            raise shed from None
        waited = self._timer() - started
        waited_ms = waited * 1000.0
        if predicted_ms >= MIN_CHECKED_WAIT_MS:  # a few ms predicted: the ratio says nothing
            known = stats.correction.get(ask.priority)
            stats.correction[ask.priority] = correction(known, actual_ms=waited_ms, predicted_ms=predicted_ms)
        stats.last_wait_ms = waited_ms
        self._pool.release(endpoint)  # the slot held for it: the plan made now takes it
        if budget is not None and not fits_budget(elapsed_ms=elapsed_ms + waited_ms, wait_ms=0.0, ttft_ms=ttft_ms, budget_ms=budget):
            self._wake(runtime)  # too late for its budget: the slot goes to the next waiter
            text = f"slot of {name} came after {_ms(waited_ms)}: too late for budget {budget}ms"
            return self._refuse(decision, ask, explain, text, wait_ms=wait_ms, waited_s=waited), waited_ms
        stats.admitted += 1
        self._metrics.record_queue_wait(provider=name, priority=klass, outcome="admitted", seconds=waited)
        if explain is not None:
            explain["admission"] = f"waited {_ms(waited_ms)} for {name} (predicted {_ms(wait_ms)}, {klass})"
        primary = dataclasses.replace(decision.candidates[0], reason=f"waited:{name}")
        return dataclasses.replace(decision, reason=primary.reason, candidates=(primary, *decision.candidates[1:])), waited_ms

    def guard(self, provider: str, priority: int) -> _Guard | None:
        """For a ``batch`` request about to be sent to ``provider`` (with preemption on):
        a guard to run its attempt in until its first byte, so an ``interactive``
        request may take its slot; None for any other request."""
        if priority != BATCH or not self.enabled or not self.settings.preempt:
            return None
        return _Guard(self, provider)

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
                "wait_correction": {CLASS_NAMES[k]: round(v, 3) for k, v in sorted(stats.correction.items())},
                "lease_ms": {ep.config.id: round(self.lease_seconds(ep) * 1000.0, 1) for ep in self._pool[name].endpoints},
            }
        return out

    def lease_seconds(self, endpoint: EndpointRuntime) -> float:
        """How long a request is expected to hold one of ``endpoint``'s slots (seconds):
        the observed mean, else the fitted TTFT plus the expected completion tokens
        times the endpoint's time per token."""
        known = self._lease_seconds.get(endpoint.key)
        if known is not None:
            return known
        tokens = self._pool.completion_tokens_mean or self._pool.config.routing.expected_completion_tokens
        itl_ms = endpoint.itl.ms if endpoint.itl.ms is not None else endpoint.itl.prior_ms
        return (endpoint.predictor.predict_ms(0) + tokens * itl_ms) / 1000.0

    # -- internals ---------------------------------------------------------------------

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
        running = [entry for entry in self._stats[name].running if not _committed(entry[4])]
        index = choose_preemption([(klass, at) for klass, at, *_ in running], priority=priority)
        if index is None:
            return False
        entry = running[index]
        self._stats[name].running.remove(entry)
        entry[2].cancel("latgate: preempted")
        return True

    def _refuse(
        self, decision: RouteDecision, ask: Ask, explain: dict[str, str] | None, text: str, *, wait_ms: float, waited_s: float
    ) -> RouteDecision:
        """The request cannot wait: the candidates left when it has a budget and any are
        left, else :class:`Overloaded` (503, ``Retry-After``)."""
        name = decision.provider
        stats = self._stats[name]
        klass = CLASS_NAMES[ask.priority]
        elsewhere = self._elsewhere(decision) if decision.budget_ms is not None else decision
        if elsewhere is not decision:
            stats.overflow += 1
            self._metrics.record_queue_wait(provider=name, priority=klass, outcome="overflow", seconds=waited_s)
            if explain is not None:
                explain["admission"] = f"not held: {text}"
            return elsewhere
        stats.shed += 1
        self._metrics.record_queue_wait(provider=name, priority=klass, outcome="shed", seconds=waited_s)
        raise _shed(f"provider {name!r} is at capacity: {text}; {klass} request not queued", wait_ms)

    def _outlook(self, runtime: ProviderRuntime, prompt_tokens: int, now: float) -> tuple[int, list[float], float, float] | None:
        """``(free slots, each busy slot's expected remaining ms, best TTFT p90 ms, a
        lease in ms)`` over the endpoints that can take traffic; None when any capacity
        is unknown or no endpoint can take traffic."""
        free = 0
        remaining: list[float] = []
        ttft = math.inf
        lease_ms = math.inf
        for ep in runtime.endpoints:
            if not self._pool.available(ep):
                continue
            capacity = ep.capacity or ep.inferred_capacity
            if capacity is None:
                return None
            load = ep.load(now)
            if now >= ep.busy_until:
                free += max(0, capacity - load)
            slot_ms = self.lease_seconds(ep) * 1000.0
            lease_ms = min(lease_ms, slot_ms)
            leases = [max(0.0, slot_ms - (now - start) * 1000.0) for start in ep.starts]  # latgate's, by age
            leases += [slot_ms] * ep.pending  # routed there, about to start
            leases += [slot_ms / 2.0] * max(0, load - len(leases))  # the engine's others: age unknown
            remaining += sorted(leases)[:capacity]
            remaining += [slot_ms] * max(0, capacity - len(leases))  # free but refused lately (busy answer)
            ttft = min(ttft, ep.predictor.p90_ms(prompt_tokens))
        if math.isinf(ttft):
            return None
        return free, remaining, ttft, lease_ms

    def _freed(self, runtime: ProviderRuntime, endpoint: EndpointRuntime, held_seconds: float | None) -> None:
        if held_seconds is not None and held_seconds > 0:
            known = self._lease_seconds.get(endpoint.key)
            self._lease_seconds[endpoint.key] = (
                held_seconds if known is None else known + LEASE_EWMA_ALPHA * (held_seconds - known)
            )
        if self._queues[runtime.name].waiting:
            self._wake(runtime)

    def _wake(self, runtime: ProviderRuntime) -> None:
        """Slots of ``runtime`` may have freed: give each to the next waiter, reserved."""
        queue = self._queues[runtime.name]
        now = self._pool.clock()
        while queue.waiting:
            endpoint = self._free_endpoint(runtime, now)
            if endpoint is None:
                return
            waiter = queue.pop()
            assert waiter is not None
            self._metrics.queue_depth_gauge(runtime.name, CLASS_NAMES[waiter.priority]).dec()
            if waiter.handle.done():
                continue
            self._pool.reserve(endpoint)
            waiter.handle.set_result(endpoint)

    def _free_endpoint(self, runtime: ProviderRuntime, now: float) -> EndpointRuntime | None:
        best, room = None, 0
        for ep in runtime.endpoints:
            capacity = ep.capacity or ep.inferred_capacity
            if capacity is None or not self._pool.available(ep) or now < ep.busy_until:
                continue
            if capacity - ep.load(now) > room:
                best, room = ep, capacity - ep.load(now)
        return best

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

    def _elsewhere(self, decision: RouteDecision) -> RouteDecision:
        """``decision`` without its primary: the next candidates, reason ``overflow:FROM``
        and ``left`` naming it (as it is when there is no other); the selector chooses
        among them and counts the overflow."""
        full = decision.provider
        rest = overflow_targets(decision.candidates[1:], decision, full)
        if not rest:
            return decision
        chosen = {t.provider for t in rest}
        first = rest[0]
        return dataclasses.replace(
            decision,
            provider=first.provider,
            model=first.model,
            reason=first.reason,
            candidates=tuple(rest),
            overflow=tuple(t for t in decision.overflow if t.provider not in chosen and t.provider != full),
            left=full,
        )


class _Guard:
    """Runs one ``batch`` attempt as a task an ``interactive`` request may cancel before
    the attempt returns (its first byte: nothing has reached the client yet)."""

    __slots__ = ("_admission", "_provider")

    def __init__(self, admission: Admission, provider: str) -> None:
        self._admission = admission
        self._provider = provider

    async def run(self, attempt: Awaitable[T], exchange: Any, early: Any = None) -> T:
        """``await attempt``; raises :class:`Preempted` when its slot was taken (and
        marks ``exchange``, the request's record, ``preempted``). ``early``: the
        stream's keep-alive state (:class:`~latgate.proxy.keepalive.EarlyHead`), whose
        head once sent makes the attempt no longer preemptible; None: no keep-alives."""
        task: asyncio.Task[T] = asyncio.ensure_future(attempt)
        stats = self._admission._stats[self._provider]
        entry = (BATCH, time.perf_counter(), task, exchange, early)
        stats.running.append(entry)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and not _cancelling(asyncio.current_task()):
                stats.preempted += 1
                exchange.queue_outcome = "preempted"
                self._admission._metrics.record_queue_wait(provider=self._provider, priority="batch", outcome="preempted", seconds=0.0)
                raise Preempted(
                    f"preempted on {self._provider!r} before its first byte by an interactive request; retry shortly",
                    headers={"retry-after": "1", "x-latgate-preempted": "1"},
                ) from None
            task.cancel()
            raise
        finally:
            if entry in stats.running:
                stats.running.remove(entry)


def _committed(early: Any) -> bool:
    """True when the response head already went out (a keep-alive stream: no preemption)."""
    return early is not None and early.committed


def _cancelling(task: asyncio.Task[Any] | None) -> bool:
    return task is not None and task.cancelling() > 0


def _has_room(pool: ProviderPool, runtime: ProviderRuntime, now: float) -> bool:
    """True when an endpoint of ``runtime`` that can take traffic has a free slot, or
    one's capacity is unknown (no queue then)."""
    for ep in runtime.endpoints:
        capacity = ep.capacity or ep.inferred_capacity
        if capacity is None:
            return True
        if ep.load(now) < capacity and now >= ep.busy_until and pool.available(ep):
            return True
    return False


def _shed(message: str, wait_ms: float) -> GatewayError:
    """503 with ``Retry-After``: the predicted wait in whole seconds, at least 1."""
    seconds = 1 if math.isinf(wait_ms) else max(1, math.ceil(wait_ms / 1000.0))
    return Overloaded(message, code="queue_full", headers={"retry-after": str(min(seconds, 60))})


def _ms(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.0f}ms"
