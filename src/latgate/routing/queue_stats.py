"""What one provider's gateway queue counted since start, and how ``/admin/providers``
(``queue``) and ``/ui`` show it (:meth:`latgate.routing.admission.Admission.describe`)."""

from __future__ import annotations

from dataclasses import dataclass

from latgate.routing.priority import CLASS_NAMES
from latgate.routing.queue import WaitQueue


@dataclass(slots=True)
class QueueStats:
    """One provider's queue outcomes since start (kept by a reload).

    Attributes:
        admitted / late / overflow / shed / preempted: requests given a slot after a wait
            (``late``: after their budget, with nowhere else to go), sent on to other
            candidates, answered 503, and cut before their first byte.
        last_wait_ms: the last wait that ended (given a slot or given up), ms.
    """

    admitted: int = 0
    late: int = 0
    overflow: int = 0
    shed: int = 0
    preempted: int = 0
    last_wait_ms: float | None = None


def queue_state(
    *, enabled: bool, queue: WaitQueue, stats: QueueStats, corrections: dict[int, float], lease_ms: dict[str, float]
) -> dict[str, object]:
    """The queue's entry of ``/admin/providers``: requests waiting now (by class name), the
    outcomes, the wait correction by class name, and each endpoint's lease (ms, by id)."""
    waiting = {klass: 0 for klass in CLASS_NAMES}
    for waiter in queue.waiting:
        waiting[CLASS_NAMES[waiter.priority]] += 1
    return {
        "enabled": enabled,
        "waiting": len(queue),
        "waiting_by_priority": waiting,
        "admitted": stats.admitted,
        "late": stats.late,
        "overflow": stats.overflow,
        "shed": stats.shed,
        "preempted": stats.preempted,
        "last_wait_ms": None if stats.last_wait_ms is None else round(stats.last_wait_ms, 1),
        "wait_correction": {CLASS_NAMES[k]: round(v, 3) for k, v in sorted(corrections.items())},
        "lease_ms": {endpoint: round(ms, 1) for endpoint, ms in lease_ms.items()},
    }
