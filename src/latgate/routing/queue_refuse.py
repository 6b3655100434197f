"""How long a request may wait in the gateway queue, and where one it cannot hold goes:
on to the candidates left (*overflow*, reason ``overflow:FROM``), or a 503 with
``Retry-After`` (*shed*; a request preempted before its first byte that the queue cannot
take back gets its own 503, with ``x-latgate-preempted``, instead). A latency budget is a
routing preference, not a deadline: a request of a class above ``batch`` whose budget no
candidate can meet is served *late* (:func:`served_late`), bounded only by its class's
longest wait.

Used by :class:`~latgate.routing.admission.Admission` when a wait cannot fit a request's
bound, and by the forwarder when an endpoint answers busy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from latgate.foundation.config.schema import QueueConfig
from latgate.foundation.errors import GatewayError, Overloaded
from latgate.foundation.metrics import Metrics
from latgate.routing.priority import BATCH, CLASS_NAMES
from latgate.routing.queue_outlook import retry_after_seconds
from latgate.routing.queue_preempt import Preempted
from latgate.routing.queue_stats import QueueStats
from latgate.routing.targets import RouteDecision, Target


def fits_budget(*, elapsed_ms: float, wait_ms: float, ttft_ms: float, budget_ms: float) -> bool:
    """True when a request ``elapsed_ms`` after its arrival, waiting ``wait_ms`` and then
    ``ttft_ms`` to its first token, meets its budget."""
    return elapsed_ms + wait_ms + ttft_ms <= budget_ms


def wait_bound_ms(settings: QueueConfig, priority: int, budget_ms: int | None, elapsed_ms: float, ttft_ms: float) -> float:
    """How long a request of class ``priority`` ``elapsed_ms`` after its arrival may still
    wait (ms; < 0: already too late): its budget's slack (less the pool's ``ttft_ms``), at
    most its class's longest wait (``[routing.queue] max_wait_ms``, ``batch_max_wait_ms``)."""
    longest = settings.batch_max_wait_ms if priority == BATCH else settings.max_wait_ms
    bound = longest - elapsed_ms
    if budget_ms is not None:
        bound = min(bound, budget_ms - elapsed_ms - ttft_ms)
    return bound


def served_late(decision: RouteDecision, priority: int) -> bool:
    """True when a request of class ``priority`` that cannot meet its budget on
    ``decision``'s provider waits there best-effort instead of being refused: it has a
    budget, is not ``batch``, and has no candidate left to overflow to (:func:`elsewhere`)."""
    return priority != BATCH and decision.budget_ms is not None and elsewhere(decision) is decision


def overflow_targets(rest: Sequence[Target], decision: RouteDecision, full: str) -> list[Target]:
    """Where a request goes when provider ``full`` has no free slot: the candidates left
    (``rest``, else the decision's overflow candidates not among its candidates), each
    with the reason ``overflow:FULL``."""
    if not rest:
        seen = {t.provider for t in decision.candidates} | {full}
        rest = [t for t in decision.overflow if t.provider not in seen]
    reason = f"overflow:{full}"
    return [dataclasses.replace(t, reason=reason) for t in rest]


def elsewhere(decision: RouteDecision) -> RouteDecision:
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


def shed_error(message: str, wait_ms: float) -> GatewayError:
    """503 with ``Retry-After``: the predicted wait, rounded up (:func:`retry_after_seconds`)."""
    return Overloaded(message, code="queue_full", headers={"retry-after": str(retry_after_seconds(wait_ms))})


def preempted_error(provider: str, why: str, wait_ms: float) -> Preempted:
    """503 with ``Retry-After`` (the predicted wait, rounded up) and ``x-latgate-preempted: 1``:
    a request cut on ``provider`` before its first byte that cannot wait again (``why``)."""
    message = f"preempted on {provider!r} before its first byte by a request that needed its slot, and {why}; retry later"
    return Preempted(message, headers={"retry-after": str(retry_after_seconds(wait_ms)), "x-latgate-preempted": "1"})


def refuse(
    decision: RouteDecision,
    *,
    priority: int,
    stats: QueueStats,
    metrics: Metrics,
    explain: dict[str, str] | None,
    text: str,
    retry_ms: float,
    waited_s: float,
    preempted: bool = False,
) -> RouteDecision:
    """A request of class ``priority`` that cannot wait for ``decision``'s provider
    (``text`` says why, after ``waited_s`` seconds): the candidates left when it has a
    budget and any are left (counted ``overflow``), else :class:`Overloaded` (503,
    ``Retry-After`` from ``retry_ms``; counted ``shed``). ``preempted``: it was cut before
    its first byte and is back in the queue: then :class:`Preempted` instead, counted
    nowhere (its cut was counted ``preempted``).

    Raises:
        Overloaded: it has nowhere else to go (:class:`Preempted` when ``preempted``).
    """
    name = decision.provider
    klass = CLASS_NAMES[priority]
    rest = elsewhere(decision) if decision.budget_ms is not None else decision
    if rest is not decision:
        stats.overflow += 1
        metrics.record_queue_wait(provider=name, priority=klass, outcome="overflow", seconds=waited_s)
        if explain is not None:
            explain["admission"] = f"not held: {text}"
        return rest
    if preempted:
        raise preempted_error(name, f"cannot wait again: {text}", retry_ms)
    stats.shed += 1
    metrics.record_queue_wait(provider=name, priority=klass, outcome="shed", seconds=waited_s)
    raise shed_error(f"provider {name!r} is at capacity: {text}; {klass} request not queued", retry_ms)


def ms_text(value: float) -> str:
    """``value`` ms as the queue's explanations show it: ``"120ms"``, ``"inf"``."""
    return "inf" if math.isinf(value) else f"{value:.0f}ms"
