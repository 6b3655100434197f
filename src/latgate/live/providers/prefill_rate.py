"""How fast an endpoint prefills now, in ms per prompt token, seen at each first token
and, before one comes, from the attempts still waiting for it.

An engine that prefills one request after another gives a request its first token once
the uncached prompt tokens ahead of it and its own are prefilled: the *work* of the
attempt, counted when it is sent (latgate's ``prefill_tokens`` there plus its own).
Each first token measures ``TTFT / work``; a recency-weighted mean of those (the
newest counting ``ALPHA``), started again from a measurement more than
``STEP_FACTOR`` times above or below it, follows a replica that slowed down (or
recovered) from its first first token after the change. An
attempt still without its first token after ``elapsed`` puts a lower bound of
``elapsed / work`` on the rate now: an endpoint that slows down is seen as slow while
its first in-flight prefill overruns, before any stream of it ends. Attempts of fewer
than ``MIN_WORK_TOKENS`` are not measured (the fixed part of a TTFT dominates them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALPHA = 0.5
STEP_FACTOR = 2.0
MIN_WORK_TOKENS = 256


@dataclass(slots=True)
class PrefillRate:
    """One endpoint's prefill rate (see the module docstring); times are clock seconds.

    Example::

        rate = PrefillRate()
        rate.sent(attempt, at=0.0, work_tokens=2_000)
        rate.ms_per_token(now=0.5)   # 0.25: the attempt is 500 ms in, no first token yet
        rate.prefilled(attempt, now=0.1)
        rate.ms_per_token(now=1.0), rate.observations   # (0.05, 1)
    """

    ewma_ms_per_token: float | None = None
    observations: int = 0
    observed_at: float | None = None
    waiting: dict[Any, tuple[float, int]] = field(default_factory=dict)
    """attempt -> (sent at, work tokens) of the measured attempts still without a first
    token, oldest first (an attempt is any hashable object, the pool's ticket)."""

    def sent(self, attempt: Any, *, at: float, work_tokens: int) -> None:
        """``attempt`` of ``work_tokens`` was sent at ``at`` (not measured when too small)."""
        if work_tokens >= MIN_WORK_TOKENS:
            self.waiting[attempt] = (at, work_tokens)

    def prefilled(self, attempt: Any, *, now: float) -> None:
        """``attempt``'s first token came at ``now``: one measurement."""
        sent = self.waiting.pop(attempt, None)
        if sent is None:
            return
        value = max(0.0, now - sent[0]) * 1000.0 / sent[1]
        old = self.ewma_ms_per_token
        if old is None or not old / STEP_FACTOR <= value <= old * STEP_FACTOR:
            self.ewma_ms_per_token = value  # a step change: the mean starts again from it
        else:
            self.ewma_ms_per_token = old + ALPHA * (value - old)
        self.observations += 1
        self.observed_at = now

    def dropped(self, attempt: Any) -> None:
        """``attempt`` ended without a first token: no measurement."""
        self.waiting.pop(attempt, None)

    def ms_per_token(self, *, now: float) -> float | None:
        """The rate now: the measured mean, or the oldest waiting attempt's lower bound
        (:meth:`waiting_ms_per_token`) when higher; None with neither."""
        rate, bound = self.ewma_ms_per_token, self.waiting_ms_per_token(now=now)
        if bound is not None and (rate is None or bound > rate):
            return bound
        return rate

    def waiting_ms_per_token(self, *, now: float) -> float | None:
        """The lower bound the oldest attempt without a first token puts on the rate
        (its time so far over its work), None without one."""
        if not self.waiting:
            return None
        at, work_tokens = next(iter(self.waiting.values()))
        return max(0.0, now - at) * 1000.0 / work_tokens
