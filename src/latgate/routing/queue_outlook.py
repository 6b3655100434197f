"""How long a request would wait for a slot of a full pool: the gateway queue's wait
prediction, and what it learns from the waits that came true.

For one provider (:meth:`WaitOutlook.view`), over the endpoints that can take traffic:
the free slots, and for each busy slot how long its request is expected to hold it
still. Each of latgate's own requests in flight is *leased* its slot for what it is
expected to cost: the fitted TTFT plus its own expected completion tokens (its plan's,
:mod:`latgate.routing.policies.completion_length`, at most its ``max_tokens``) times the
endpoint's learned time per token. A slot whose request's length is unknown (the
engine's other requests, a request sent without one) is leased for what a request has
been seen to hold one there (a recency-weighted mean, :meth:`WaitOutlook.observe_lease`);
before any, for the fitted TTFT plus the pool's recent median completion, else the
waiting request's own expected completion, else ``[routing] expected_completion_tokens``,
times the time per token (learned, else the role's prior). A request is expected to hold
its slot for its lease less its age; one that has outlived its lease, for as long again
as it has overrun it (:func:`expected_hold_ms`: a slowed endpoint's requests run a
multiple of their lease, so the longer one has overrun, the longer it is likely to go
on, and waiting on it as if it freed now is how a waiter spends its slack for nothing);
the engine's other requests (age unknown), half a lease.

A newcomer with ``k`` requests ahead waits for the ``k+1``-th slot to free
(:func:`~latgate.routing.queue.predicted_wait_ms`). Until an endpoint's lease has been
observed (a *cold* pool), the wait is at least what its capacity gives: a slot frees
every held lease / slots (the busy slots' mean lease), so the ``k+1``-th in line waits
``(k+1)`` of those. The prediction is multiplied by a correction per provider and class,
learnt from the waits that came true (at least 1: :func:`~latgate.routing.queue.correction`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from latgate.live.providers.endpoint import EndpointRuntime
from latgate.live.providers.pool import ProviderPool
from latgate.live.providers.runtime import ProviderRuntime
from latgate.routing.queue import correction, predicted_wait_ms

LEASE_EWMA_ALPHA = 0.2
MIN_CHECKED_WAIT_MS = 20.0
"""Waits predicted shorter than this do not teach the correction."""
MAX_RETRY_AFTER_SECONDS = 60
"""``Retry-After`` on a shed request is its predicted wait, rounded up, at most this."""


@dataclass(frozen=True, slots=True)
class View:
    """One provider's slots now, as the wait prediction sees them.

    Attributes:
        free: slots free now.
        remaining_ms: for each busy slot, how long its request is expected to hold it.
        ttft_ms: the best TTFT p90 among the endpoints, for the request's prompt.
        lease_ms: the shortest lease among the endpoints (a whole new request's hold).
        slots: the capacity of the endpoints counted.
        cold: no endpoint counted has an observed lease yet.
        held_lease_ms: the mean whole lease of the busy slots (each at its own request's
            expected completion where known); ``lease_ms`` when none is busy.
    """

    free: int
    remaining_ms: list[float]
    ttft_ms: float
    lease_ms: float
    slots: int
    cold: bool
    held_lease_ms: float = math.inf


def expected_hold_ms(lease_ms: float, age_ms: float) -> float:
    """How much longer a request ``age_ms`` into a lease of ``lease_ms`` is expected to
    hold its slot (ms): the rest of its lease, ``lease_ms - age_ms``; past it, its
    overrun so far, ``age_ms - lease_ms``. Zero only at the lease's end.

    Example::

        expected_hold_ms(700.0, 200.0)   # 500.0: within its lease
        expected_hold_ms(700.0, 1500.0)  # 800.0: 800 ms over, as long again to go
    """
    return abs(lease_ms - age_ms)


def retry_after_seconds(wait_ms: float) -> int:
    """``Retry-After`` for a request shed with a predicted wait of ``wait_ms``: whole
    seconds, rounded up, within [1, :data:`MAX_RETRY_AFTER_SECONDS`] (1 when unknown)."""
    if math.isinf(wait_ms) or math.isnan(wait_ms):
        return 1
    return min(MAX_RETRY_AFTER_SECONDS, max(1, math.ceil(wait_ms / 1000.0)))


class WaitOutlook:
    """The wait prediction of every provider of ``pool`` (see the module docstring)."""

    def __init__(self, pool: ProviderPool) -> None:
        self._pool = pool
        self.leases: dict[str, float] = {}  # endpoint key -> observed seconds a request holds a slot
        self.corrections: dict[str, dict[int, float]] = {name: {} for name in pool.providers}

    def lease_seconds(self, endpoint: EndpointRuntime, *, completion_tokens: int = 0) -> float:
        """How long a request of unknown length is expected to hold one of ``endpoint``'s
        slots (seconds): the observed mean, else the fitted TTFT plus the pool's recent
        median completion (else ``completion_tokens``, else ``[routing]
        expected_completion_tokens``) times the endpoint's time per token."""
        known = self.leases.get(endpoint.key)
        if known is not None:
            return known
        tokens = (
            self._pool.completion_tokens_mean
            or completion_tokens
            or self._pool.config.routing.expected_completion_tokens
        )
        return self._priced_ms(endpoint, tokens) / 1000.0

    def held_ms(self, endpoint: EndpointRuntime, completion_tokens: int, unknown_ms: float) -> float:
        """The whole lease (ms) of a request expected to generate ``completion_tokens``
        on ``endpoint``: its fitted TTFT plus those tokens times the time per token
        (learned, else the role's prior). ``unknown_ms`` (:meth:`lease_seconds`) for a
        length unknown (0). While the time per token is only its prior but leases have
        been observed there, the longer of the two: observed leases of short requests
        (a warm-up of one-token requests) say nothing of a long one's hold."""
        if completion_tokens <= 0:
            return unknown_ms
        priced = self._priced_ms(endpoint, completion_tokens)
        if endpoint.itl.ms is None and endpoint.key in self.leases:
            return max(unknown_ms, priced)
        return priced

    @staticmethod
    def _priced_ms(endpoint: EndpointRuntime, completion_tokens: float) -> float:
        itl_ms = endpoint.itl.ms if endpoint.itl.ms is not None else endpoint.itl.prior_ms
        return endpoint.predictor.predict_ms(0) + completion_tokens * itl_ms

    def observe_lease(self, endpoint: EndpointRuntime, held_seconds: float) -> None:
        """A request held a slot of ``endpoint`` for ``held_seconds`` (> 0)."""
        known = self.leases.get(endpoint.key)
        self.leases[endpoint.key] = (
            held_seconds if known is None else known + LEASE_EWMA_ALPHA * (held_seconds - known)
        )

    def view(
        self, runtime: ProviderRuntime, prompt_tokens: int, now: float, *, completion_tokens: int = 0
    ) -> View | None:
        """``runtime``'s slots now (:class:`View`) for a request of ``prompt_tokens``
        expected to generate ``completion_tokens`` (0: unknown; the price of a slot whose
        request's length is unknown before any is known: :meth:`lease_seconds`); None
        when any capacity is unknown or no endpoint can take traffic."""
        free = slots = 0
        remaining: list[float] = []
        ttft = lease_ms = math.inf
        held_total, held_count = 0.0, 0  # the busy slots' whole leases
        cold = True
        for ep in runtime.endpoints:
            if not self._pool.available(ep):
                continue
            capacity = ep.capacity or ep.inferred_capacity
            if capacity is None:
                return None
            load = ep.load(now)
            if now >= ep.busy_until:
                free += max(0, capacity - load)
            slots += capacity
            cold = cold and ep.key not in self.leases
            slot_ms = self.lease_seconds(ep, completion_tokens=completion_tokens) * 1000.0
            lease_ms = min(lease_ms, slot_ms)
            held = [  # latgate's own, by age: (left, whole lease) in ms
                (expected_hold_ms(ms, (now - start) * 1000.0), ms)
                for start, ms in ((start, self.held_ms(ep, tokens, slot_ms)) for start, tokens in ep.leases)
            ]
            held += [(slot_ms, slot_ms)] * ep.pending  # routed there, about to start
            held += [(slot_ms / 2.0, slot_ms)] * max(0, load - len(held))  # the engine's others: age unknown
            held = sorted(held)[:capacity]
            remaining += [left for left, _ in held]
            held_total += sum(ms for _, ms in held)
            held_count += len(held)
            remaining += [slot_ms] * max(0, capacity - len(held))  # free but refused lately (busy answer)
            ttft = min(ttft, ep.predictor.p90_ms(prompt_tokens))
        if math.isinf(ttft):
            return None
        return View(
            free=free, remaining_ms=remaining, ttft_ms=ttft, lease_ms=lease_ms, slots=slots, cold=cold,
            held_lease_ms=held_total / held_count if held_count else lease_ms,
        )  # fmt: skip

    def predict_ms(self, view: View, *, ahead: int) -> float:
        """The wait for a slot with ``ahead`` requests before it, from the leases alone
        (uncorrected): at least ``(ahead + 1)`` slot intervals (the busy slots' mean
        lease / slots) on a cold pool."""
        wait = predicted_wait_ms(view.remaining_ms, ahead=ahead, lease_ms=view.lease_ms)
        interval = view.lease_ms if math.isinf(view.held_lease_ms) else view.held_lease_ms
        if view.cold and view.slots and not math.isinf(interval):
            wait = max(wait, (ahead + 1) * interval / view.slots)
        return wait

    def corrected_ms(self, provider: str, priority: int, predicted_ms: float) -> float:
        """``predicted_ms`` times the correction learnt for ``provider``'s class ``priority``."""
        return predicted_ms * self.corrections[provider].get(priority, 1.0)

    def learn(self, provider: str, priority: int, *, predicted_ms: float, actual_ms: float) -> None:
        """A request of class ``priority`` predicted to wait ``predicted_ms`` for
        ``provider`` waited ``actual_ms``: the correction follows (waits predicted
        under :data:`MIN_CHECKED_WAIT_MS` teach nothing)."""
        if predicted_ms < MIN_CHECKED_WAIT_MS:
            return
        known = self.corrections[provider].get(priority)
        self.corrections[provider][priority] = correction(
            known, actual_ms=actual_ms, predicted_ms=predicted_ms
        )

    def carry_from(self, previous: WaitOutlook) -> None:
        """Keep what ``previous`` (the outlook of the config a reload replaces) learnt,
        for the endpoints and providers still here."""
        keys = {ep.key for runtime in self._pool.providers.values() for ep in runtime.endpoints}
        self.leases.update({key: value for key, value in previous.leases.items() if key in keys})
        for name, learnt in previous.corrections.items():
            if name in self.corrections:
                self.corrections[name].update(learnt)


def has_room(pool: ProviderPool, runtime: ProviderRuntime, now: float, headroom: int = 0) -> bool:
    """True when the endpoints of ``runtime`` that can take traffic have more than
    ``headroom`` free slots, or one's capacity is unknown (no queue then)."""
    free = 0
    for ep in runtime.endpoints:
        capacity = ep.capacity or ep.inferred_capacity
        if capacity is None:
            return True
        if now >= ep.busy_until and pool.available(ep):
            free += max(0, capacity - ep.load(now))
            if free > headroom:
                return True
    return False


def batch_headroom(runtime: ProviderRuntime, setting: int) -> int:
    """Free slots of ``runtime`` a ``batch`` request does not take: ``setting``
    (``batch_headroom_slots``) on a provider of at least 4 slots per headroom slot, else 0."""
    slots = sum(ep.capacity or ep.inferred_capacity or 0 for ep in runtime.endpoints)
    return setting if setting and slots >= 4 * setting else 0


def free_endpoint(pool: ProviderPool, runtime: ProviderRuntime, now: float) -> EndpointRuntime | None:
    """The endpoint of ``runtime`` with the most free slots that can take traffic now, or None."""
    best, room = None, 0
    for ep in runtime.endpoints:
        capacity = ep.capacity or ep.inferred_capacity
        if capacity is None or not pool.available(ep) or now < ep.busy_until:
            continue
        if capacity - ep.load(now) > room:
            best, room = ep, capacity - ep.load(now)
    return best
