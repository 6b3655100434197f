"""Deadline-aware admission to a pool that refuses instead of queueing (TileRT).

A TileRT router takes one request per decode node and answers 429 at once when none is
free (:class:`~latgate.connectors.base.TileRtConnector`). When a latency-sensitive
request's rule target is such a pool (its connector has ``queues = False``) and every
node is taken, latgate may hold the request until a node frees, but only while that
can still meet the request's time-to-first-token budget:

    predicted wait + the pool's TTFT (90th percentile of its fit) <= budget

The predicted wait comes from the leases: each request on a node has been there for its
age and holds it for the endpoint's observed lease time on average (a recency-weighted
mean of how long latgate's answered requests held a node there, the first one taken as
it is; before any, the endpoint's ``slot_seconds`` prior);
a request that finds ``k`` others already waiting needs the ``k+1``-th node to free
(:func:`predicted_wait_ms`). Requests the engine reports that are not latgate's have an
unknown age: half a ``slot_seconds`` is left of each. When the wait fits, the request
waits in arrival order, at most until its budget's slack (budget minus TTFT) is spent;
a node freed (one of latgate's requests there ended, or a load read shows one) goes to
the first waiter, reserved for it at once so no newcomer takes it. Otherwise, and when
the slack runs out, the request goes on at once to the candidates left (the fallbacks,
else the overflow candidates; reason ``overflow:FROM``), where the selector takes the
one with the lowest predicted e2e latency among those predicted to meet the budget. A request that got a node is routed
with reason ``waited:FROM``.

Ordinary requests (no budget, or not latency-sensitive) never wait; neither does any
request under a strategy other than ``latgate`` or with ``[routing] admission =
false``. Waits are counted (``latgate_admission_wait_seconds{provider,outcome}``,
``latgate_admission_declined_total``), shown per provider in ``/admin/providers``
(``admission``) and, with ``X-Latgate-Debug: 1``, in the ``X-Latgate-Admission``
response header.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from latgate.metrics import Metrics
from latgate.providers.endpoint import EndpointRuntime
from latgate.providers.pool import ProviderPool, ProviderRuntime
from latgate.routing.targets import RouteDecision, Target

MAX_WAITERS = 64
"""Requests held per pool at most; more are sent on at once."""
MAX_WAIT_SECONDS = 5.0
"""No request is held longer than this, whatever its budget."""
LEASE_EWMA_ALPHA = 0.2


def predicted_wait_ms(remaining_ms: Sequence[float], *, ahead: int) -> float:
    """How long until a node frees for a request with ``ahead`` requests waiting before it.

    Args:
        remaining_ms: for each busy node, how long its request is expected to hold it
            still (ms, >= 0).
        ahead: requests already waiting (they take the first nodes to free).

    Returns:
        The ``ahead + 1``-th smallest remaining time; ``inf`` when more are waiting
        than there are busy nodes (a second round of leases is not predicted).

    Example::

        predicted_wait_ms([300.0, 40.0], ahead=0)  # 40.0
        predicted_wait_ms([300.0, 40.0], ahead=1)  # 300.0
    """
    ordered = sorted(remaining_ms)
    return ordered[ahead] if ahead < len(ordered) else math.inf


def fits_budget(*, wait_ms: float, ttft_ms: float, budget_ms: float) -> bool:
    """True when waiting ``wait_ms`` and then ``ttft_ms`` to the first token meets the
    budget (and the wait is under :data:`MAX_WAIT_SECONDS`)."""
    return wait_ms <= MAX_WAIT_SECONDS * 1000.0 and wait_ms + ttft_ms <= budget_ms


def overflow_targets(rest: Sequence[Target], decision: RouteDecision, full: str) -> list[Target]:
    """Where a request goes when provider ``full`` has no free slot: the candidates left
    (``rest``, else the decision's overflow candidates not among its candidates), each
    with the reason ``overflow:FULL``."""
    if not rest:
        seen = {t.provider for t in decision.candidates} | {full}
        rest = [t for t in decision.overflow if t.provider not in seen]
    reason = f"overflow:{full}"
    return [dataclasses.replace(t, reason=reason) for t in rest]


@dataclass(slots=True)
class _Queue:
    """One provider's waiting requests and what became of those before."""

    waiters: deque[asyncio.Future[EndpointRuntime]] = field(default_factory=deque)
    admitted: int = 0
    timed_out: int = 0
    declined: int = 0
    last_wait_ms: float | None = None


class Admission:
    """Holds latency-sensitive requests for a free slot of a no-queue pool.

    Args:
        pool: the providers and their endpoints; its ``slot_freed`` hook is taken.
        metrics: where waits and declines are counted.
        enabled: ``[routing] admission`` under strategy ``latgate``; off, :meth:`hold`
            returns every decision as it is.
        clock: seconds, monotonic (the pool's clock: lease ages are on it).
    """

    def __init__(self, *, pool: ProviderPool, metrics: Metrics, enabled: bool) -> None:
        self._pool = pool
        self._metrics = metrics
        self.enabled = enabled
        self._queues: dict[str, _Queue] = {
            name: _Queue() for name, runtime in pool.providers.items() if not runtime.connector.queues
        }
        self._lease_seconds: dict[str, float] = {}  # endpoint key -> observed time a request holds a node
        pool.slot_freed = self._freed

    async def hold(self, decision: RouteDecision, *, explain: dict[str, str] | None = None) -> RouteDecision:
        """The decision to plan with: as it is (an ordinary request, a pool with a free
        slot, nothing known of its capacity), with its primary's reason ``waited:FROM``
        once a slot was given to it, or with the primary left out (reason
        ``overflow:FROM``) when it could not wait within its budget. ``explain``
        (``X-Latgate-Debug``) receives a one-line account under ``admission``."""
        queue = self._queues.get(decision.provider)
        budget = decision.budget_ms
        if not self.enabled or queue is None or budget is None or not decision.latency_sensitive:
            return decision
        runtime = self._pool[decision.provider]
        now = self._pool.clock()
        outlook = self._outlook(runtime, decision.prompt_tokens, now)
        if outlook is None:
            return decision
        free, remaining_ms, ttft_ms = outlook
        waiting = sum(1 for waiter in queue.waiters if not waiter.done())
        if free > waiting:
            return decision
        wait_ms = predicted_wait_ms(remaining_ms, ahead=waiting)
        if waiting >= MAX_WAITERS or not fits_budget(wait_ms=wait_ms, ttft_ms=ttft_ms, budget_ms=budget):
            queue.declined += 1
            self._metrics.record_admission_declined(provider=runtime.name)
            if explain is not None:
                explain["admission"] = f"not held: {runtime.name} wait {_ms(wait_ms)} + TTFT {_ms(ttft_ms)} > budget {budget}ms"
            return self._elsewhere(decision)
        slack_seconds = min(MAX_WAIT_SECONDS, (budget - ttft_ms) / 1000.0)
        waiter: asyncio.Future[EndpointRuntime] = asyncio.get_running_loop().create_future()
        queue.waiters.append(waiter)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(slack_seconds):
                endpoint = await waiter
        except TimeoutError:
            waited = time.perf_counter() - started
            self._forget(queue, waiter)
            queue.timed_out += 1
            queue.last_wait_ms = waited * 1000.0
            self._metrics.record_admission_wait(provider=runtime.name, seconds=waited, admitted=False)
            if explain is not None:
                explain["admission"] = f"gave up on {runtime.name} after {_ms(waited * 1000.0)} (predicted {_ms(wait_ms)})"
            return self._elsewhere(decision)
        except asyncio.CancelledError:  # the client left while waiting
            self._forget(queue, waiter)
            raise
        waited = time.perf_counter() - started
        self._pool.release(endpoint)  # the slot held for it: the plan made now takes it
        queue.admitted += 1
        queue.last_wait_ms = waited * 1000.0
        self._metrics.record_admission_wait(provider=runtime.name, seconds=waited, admitted=True)
        if explain is not None:
            explain["admission"] = f"waited {_ms(waited * 1000.0)} for {runtime.name} (predicted {_ms(wait_ms)}, budget {budget}ms)"
        primary = dataclasses.replace(decision.candidates[0], reason=f"waited:{runtime.name}")
        return dataclasses.replace(decision, reason=primary.reason, candidates=(primary, *decision.candidates[1:]))

    def describe(self) -> dict[str, dict[str, object]]:
        """Per no-queue provider: requests waiting now and the outcomes since start (for
        ``/admin/providers``)."""
        return {
            name: {
                "enabled": self.enabled,
                "waiting": sum(1 for waiter in queue.waiters if not waiter.done()),
                "admitted": queue.admitted,
                "timed_out": queue.timed_out,
                "declined": queue.declined,
                "last_wait_ms": None if queue.last_wait_ms is None else round(queue.last_wait_ms, 1),
                "lease_ms": {ep.config.id: round(self.lease_seconds(ep) * 1000.0, 1) for ep in self._pool[name].endpoints},
            }
            for name, queue in self._queues.items()
        }

    # -- internals ---------------------------------------------------------------------

    def _outlook(self, runtime: ProviderRuntime, prompt_tokens: int, now: float) -> tuple[int, list[float], float] | None:
        """``(free slots, each busy slot's expected remaining ms, best TTFT p90 ms)`` over
        the endpoints that can take traffic; None when any capacity is unknown or no
        endpoint can take traffic."""
        free = 0
        remaining: list[float] = []
        ttft = math.inf
        for ep in runtime.endpoints:
            if not self._pool.available(ep):
                continue
            capacity = ep.capacity or ep.inferred_capacity
            if capacity is None:
                return None
            load = ep.load(now)
            free += max(0, capacity - load)
            slot_ms = self.lease_seconds(ep) * 1000.0
            leases = [max(0.0, slot_ms - (now - start) * 1000.0) for start in ep.starts]  # latgate's, by age
            leases += [slot_ms] * ep.pending  # routed there, about to start
            leases += [slot_ms / 2.0] * max(0, load - len(leases))  # the engine's others: age unknown
            remaining += sorted(leases)[:capacity]
            ttft = min(ttft, ep.predictor.p90_ms(prompt_tokens))
        if math.isinf(ttft):
            return None
        return free, remaining, ttft

    def lease_seconds(self, endpoint: EndpointRuntime) -> float:
        """How long a request is expected to hold one of ``endpoint``'s nodes (seconds)."""
        return self._lease_seconds.get(endpoint.key, endpoint.slot_seconds)

    def _freed(self, runtime: ProviderRuntime, endpoint: EndpointRuntime, held_seconds: float | None) -> None:
        if held_seconds is not None and held_seconds > 0:
            known = self._lease_seconds.get(endpoint.key)
            self._lease_seconds[endpoint.key] = (
                held_seconds if known is None else known + LEASE_EWMA_ALPHA * (held_seconds - known)
            )
        self._wake(runtime)

    def _wake(self, runtime: ProviderRuntime) -> None:
        """A slot of ``runtime`` may have freed: give it to the first waiter, reserved."""
        queue = self._queues.get(runtime.name)
        if queue is None or not queue.waiters:
            return
        now = self._pool.clock()
        while queue.waiters:
            endpoint = self._free_endpoint(runtime, now)
            if endpoint is None:
                return
            waiter = queue.waiters.popleft()
            if waiter.done():
                continue
            self._pool.reserve(endpoint)
            waiter.set_result(endpoint)

    def _free_endpoint(self, runtime: ProviderRuntime, now: float) -> EndpointRuntime | None:
        best, room = None, 0
        for ep in runtime.endpoints:
            capacity = ep.capacity or ep.inferred_capacity
            if capacity is None or not self._pool.available(ep):
                continue
            if capacity - ep.load(now) > room:
                best, room = ep, capacity - ep.load(now)
        return best

    def _forget(self, queue: _Queue, waiter: asyncio.Future[EndpointRuntime]) -> None:
        """Drop a waiter that stopped waiting; a slot given to it meanwhile is passed on."""
        if waiter.done() and not waiter.cancelled():
            endpoint = waiter.result()
            self._pool.release(endpoint)
            runtime = next(r for r in self._pool.providers.values() if endpoint in r.endpoints)
            self._wake(runtime)
        else:
            waiter.cancel()
        if waiter in queue.waiters:
            queue.waiters.remove(waiter)

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


def _ms(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.0f}ms"
