"""A provider's gateway queue as pure logic: who waits, who goes next, who is shed.

The holder (:class:`~latgate.routing.admission.Admission`) keeps one :class:`WaitQueue`
per provider and asks it, on plain data, three things:

- *where a newcomer stands*: :meth:`WaitQueue.ahead_of` (the waiters that go before
  it) and, with the slots' remaining lease times, :func:`predicted_wait_ms`;
- *whether it may wait*: :meth:`WaitQueue.push` (bounded by a count: a full queue
  sheds its newest lowest-class waiter for a higher-class newcomer, else the newcomer);
- *who takes a freed slot*: :meth:`WaitQueue.pop`, in this order: the highest class
  (:mod:`latgate.routing.priority`); inside it, fair shares of tokens between tenants
  (keys; the client's address without one) by start-time fair queueing (Goyal, Vin and Cheng,
  SIGCOMM 1996): a quiet key is not starved by a flood, and a key that was idle earns
  no credit; inside a tenant, the earliest deadline (EDF), then arrival.

:func:`choose_preemption` picks the running ``batch`` request (its client has received
nothing yet) that gives its slot to a request that would otherwise wait: one of a higher
class, or a ``batch`` one of a tenant within its share (:meth:`WaitQueue.within_share`)
while another tenant has a backlog.
Times are the caller's clock seconds; nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from latgate.routing.priority import BATCH


@dataclass(slots=True, eq=False)
class Waiter:
    """One request waiting for a slot.

    Attributes:
        priority: its class number (:mod:`latgate.routing.priority`).
        deadline: clock seconds by which it must have a slot to be of use (its arrival
            plus its budget's slack, or plus its class's longest wait).
        tenant: whose share it is charged to (the key's name, with the session).
        cost_tokens: prompt plus expected completion tokens: what its slot costs.
        enqueued_at: clock seconds it started waiting.
        handle: the holder's own object (a future), untouched here.
    """

    priority: int
    deadline: float
    tenant: str
    cost_tokens: int
    enqueued_at: float
    handle: Any = None
    seq: int = 0
    tag: float = 0.0


@dataclass(slots=True)
class Place:
    """Where a request that found its pool full stands, in ms
    (:meth:`latgate.routing.admission.Admission.hold`).

    Attributes:
        ttft_ms: the pool's TTFT p90 for its prompt.
        elapsed_ms: since it arrived.
        bound_ms: how long it may still wait (< 0: a slot now is already too late): its
            budget's slack, or its class's longest wait when it is served ``late``.
        predicted_ms: its wait from the slots' leases alone.
        wait_ms: that, corrected by the waits that came true (with somewhere else to go,
            times a safety factor): what it is held to.
        shown_ms: the corrected wait: what ``Retry-After`` says.
        slots: the pool's capacity (slots of the endpoints that can take traffic).
        deadline_ms: its budget's slack (else ``bound_ms``): what orders it among the
            waiters (earliest deadline first), past or not.
        late: it is served best-effort when no slot comes within its budget: it has a
            budget, is not ``batch`` and has no candidate left to overflow to.
    """

    ttft_ms: float
    elapsed_ms: float
    bound_ms: float
    predicted_ms: float
    wait_ms: float
    shown_ms: float
    slots: int
    deadline_ms: float
    late: bool


@dataclass(slots=True)
class WaitQueue:
    """One provider's waiting requests (see the module docstring for the order).

    Fair shares are start-time fair queueing over tokens, one per class: a waiter's tag
    is where its tenant's share of its class's virtual time starts (``max(virtual
    time, the end of the tenant's previous request of that class)``), its cost ending
    the tenant's share; the lowest tag of the top class goes first, and that class's
    virtual time moves to it. A tenant's requests of one class do not push back its
    requests of another (a key's interactive turns cost its batch jobs nothing). A tenant's
    backlog pushes its later requests' tags out, so a newcomer overtakes a flood; a
    tenant that was idle starts at the virtual time, with no credit saved up.

    Args:
        max_waiting: waiters at most (``[routing.queue] max_waiting``).
    """

    max_waiting: int
    waiting: list[Waiter] = field(default_factory=list)
    finish: dict[tuple[int, str], float] = field(default_factory=dict)  # (class, tenant) -> end of its share
    virtual: dict[int, float] = field(default_factory=dict)  # class -> its virtual time (tokens)
    _seq: int = 0

    def __len__(self) -> int:
        return len(self.waiting)

    def ahead_of(self, priority: int, tenant: str | None = None, deadline: float = math.inf) -> int:
        """Waiters that go before a newcomer of class ``priority`` with ``deadline`` (clock
        seconds): every one of a higher class, and of its own class those :meth:`pop`
        serves first. Inside its tenant (``tenant``) that is the waiters with a deadline
        no later than its own (earliest deadline first); of the other tenants, those
        whose share starts no later than the place its own deadline gives it among its
        tenant's shares. A quiet tenant's newcomer stands before a flood's backlog, and a
        tight deadline before its own tenant's looser ones. ``tenant`` None: every one of
        its class."""
        if tenant is None:
            return sum(1 for w in self.waiting if w.priority >= priority)
        own = [w for w in self.waiting if w.priority == priority and w.tenant == tenant]
        before = sum(1 for w in own if w.deadline <= deadline)
        start = max(self.virtual.get(priority, 0.0), self.finish.get((priority, tenant), 0.0))
        # the share its deadline takes over among its tenant's, and the arrival that share ties on
        place, seq = sorted([(w.tag, w.seq) for w in own] + [(start, math.inf)])[before]
        others = sum(
            1
            for w in self.waiting
            if w.priority > priority or (w.priority == priority and w.tenant != tenant and (w.tag, w.seq) < (place, seq))
        )
        return before + others

    def top_priority(self) -> int | None:
        """The class of the waiter :meth:`pop` would give a slot to (None: no waiter)."""
        return max((w.priority for w in self.waiting), default=None)

    def push(self, waiter: Waiter) -> Waiter | None:
        """Queue ``waiter``; returns the one that must leave instead (shed): None when
        there was room, the newest waiter of the lowest class below ``waiter``'s when the
        queue was full, else ``waiter`` itself."""
        if len(self.waiting) >= self.max_waiting:
            lowest = min(self.waiting, key=lambda w: (w.priority, -w.seq), default=None)
            if lowest is None or lowest.priority >= waiter.priority:
                return waiter
            self.waiting.remove(lowest)
            self._append(waiter)
            return lowest
        self._append(waiter)
        return None

    def _append(self, waiter: Waiter) -> None:
        self._seq += 1
        waiter.seq = self._seq
        share = (waiter.priority, waiter.tenant)
        start = max(self.virtual.get(waiter.priority, 0.0), self.finish.get(share, 0.0))
        waiter.tag = start
        self.finish[share] = start + waiter.cost_tokens
        self.waiting.append(waiter)

    def pop(self) -> Waiter | None:
        """The waiter that takes a freed slot (removed), or None: of the highest class,
        the tenant whose share starts first, and of its waiters the earliest deadline
        (which takes over that share's tag)."""
        if not self.waiting:
            return None
        top = max(w.priority for w in self.waiting)
        first = min((w for w in self.waiting if w.priority == top), key=lambda w: (w.tag, w.seq))
        chosen = min(
            (w for w in self.waiting if w.priority == top and w.tenant == first.tenant), key=lambda w: (w.deadline, w.seq)
        )
        if chosen is not first:
            chosen.tag, first.tag = first.tag, chosen.tag
        self.waiting.remove(chosen)
        self.virtual[top] = max(self.virtual.get(top, 0.0), chosen.tag)
        if len(self.finish) > 4 * self.max_waiting:  # forget tenants whose shares ended
            for share in [s for s, end in self.finish.items() if end <= self.virtual.get(s[0], 0.0)]:
                del self.finish[share]
        return chosen

    def waiting_of(self, priority: int, tenant: str) -> int:
        """Waiters of class ``priority`` charged to ``tenant`` (0: no backlog of its own)."""
        return sum(1 for w in self.waiting if w.priority == priority and w.tenant == tenant)

    def backlogged(self, priority: int) -> set[str]:
        """The tenants with waiters of class ``priority``."""
        return {w.tenant for w in self.waiting if w.priority == priority}

    def within_share(self, priority: int, tenant: str, burst_tokens: float = 0.0) -> bool:
        """True when ``tenant`` has no waiter of class ``priority`` and its share of that
        class ends at most ``burst_tokens`` past the class's virtual time: it has been
        served no more than its fair share (and that burst), so a slot taken for it
        (:meth:`charge`) is one it is owed."""
        if any(w.priority == priority and w.tenant == tenant for w in self.waiting):
            return False
        return self.finish.get((priority, tenant), 0.0) <= self.virtual.get(priority, 0.0) + burst_tokens

    def charge(self, waiter: Waiter) -> None:
        """Count ``waiter``'s cost in its tenant's share (a slot taken for it by preemption)
        without queueing it; the class's virtual time stays (it moves as waiters are served
        in order, and this one went out of order)."""
        share = (waiter.priority, waiter.tenant)
        start = max(self.virtual.get(waiter.priority, 0.0), self.finish.get(share, 0.0))
        waiter.tag = start
        self.finish[share] = start + waiter.cost_tokens

    def remove(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out (it gave up or was answered elsewhere); False if it was not in."""
        try:
            self.waiting.remove(waiter)
        except ValueError:
            return False
        return True

    def expired(self, now: float) -> list[Waiter]:
        """The waiters whose deadline has passed at ``now``, removed."""
        gone = [w for w in self.waiting if w.deadline <= now]
        for waiter in gone:
            self.waiting.remove(waiter)
        return gone


def predicted_wait_ms(remaining_ms: Sequence[float], *, ahead: int, lease_ms: float | None = None) -> float:
    """How long until a slot frees for a request with ``ahead`` requests before it.

    Args:
        remaining_ms: for each busy slot, how long its request is expected to hold it
            still (ms, >= 0).
        ahead: requests that take the first slots to free.
        lease_ms: how long a new request holds a slot; None: no second round through
            the slots is predicted.

    Returns:
        The ``ahead + 1``-th slot to free: ``sorted(remaining_ms)[ahead % n]`` plus
        ``ahead // n`` whole leases; ``inf`` when there is no busy slot, or a second
        round is needed without ``lease_ms``.

    Example::

        predicted_wait_ms([300.0, 40.0], ahead=1)                  # 300.0
        predicted_wait_ms([300.0, 40.0], ahead=2, lease_ms=360.0)  # 400.0
    """
    count = len(remaining_ms)
    if not count:
        return math.inf
    rounds, index = divmod(ahead, count)
    if rounds and lease_ms is None:
        return math.inf
    return sorted(remaining_ms)[index] + rounds * (lease_ms or 0.0)


def choose_preemption(
    running: Sequence[tuple[str, float]], *, priority: int, tenant: str, backlogged: Collection[str]
) -> int | None:
    """Which running ``batch`` attempt (its client has received nothing yet) gives its slot
    to a request that would otherwise wait.

    Args:
        running: ``(tenant, started_at)`` of each preemptible ``batch`` attempt (clock seconds).
        priority: the class of the request that needs a slot.
        tenant: whose request it is.
        backlogged: the tenants with ``batch`` requests waiting (asking more than they are served).

    Returns:
        The index of the youngest attempt (the least work lost) of the tenant holding the
        most of them: among every tenant's for a class above ``batch``; for a ``batch``
        request, among the other tenants' that have a backlog (the caller checks that
        the request's own tenant is within its share). None when there is none.

    Example::

        choose_preemption([("flood", 1.0), ("flood", 2.0), ("quiet", 3.0)],
                          priority=BATCH, tenant="quiet", backlogged={"flood"})  # 1
    """
    if priority > BATCH:
        candidates = list(range(len(running)))
    else:
        candidates = [i for i, (owner, _) in enumerate(running) if owner != tenant and owner in backlogged]
    if not candidates:
        return None
    held: dict[str, int] = {}
    for index in candidates:
        held[running[index][0]] = held.get(running[index][0], 0) + 1
    victim = max(held, key=lambda owner: held[owner])
    return max((i for i in candidates if running[i][0] == victim), key=lambda i: running[i][1])


def correction(ratio: float | None, *, actual_ms: float, predicted_ms: float, alpha: float = 0.3) -> float:
    """The wait prediction's multiplier after one outcome: a recency-weighted mean of
    ``actual / predicted`` (the first taken as it is), kept within [1, 4] so a lucky
    run never makes the prediction more optimistic than the leases say, and one
    outlier cannot make it useless. ``predicted_ms`` <= 0 leaves it unchanged."""
    if predicted_ms <= 0.0 or math.isinf(predicted_ms):
        return 1.0 if ratio is None else ratio
    observed = actual_ms / predicted_ms
    value = observed if ratio is None else ratio + alpha * (observed - ratio)
    return min(4.0, max(1.0, value))
