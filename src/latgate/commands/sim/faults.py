"""Fault injection: which requests fail, get rate limited, stall or lose their connection.

One RNG per simulator, seeded with ``SimOptions.seed``, draws the same number of
values for every request, so a given sequence of requests meets the same faults on
every run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from latgate.commands.sim.options import SimOptions


@dataclass(frozen=True)
class FaultPlan:
    """The faults of one request.

    ``stall_before_step`` / ``drop_before_step`` index the reply's token steps
    (1..steps): the stall happens, or the connection closes, just before that step is
    sent; ``steps`` itself means after the last token, before the finish chunk and
    ``[DONE]``. ``None``: no such fault.
    """

    error: bool = False
    rate_limited: bool = False
    stall_before_step: int | None = None
    drop_before_step: int | None = None


NO_FAULTS = FaultPlan()


class FaultInjector:
    """Draws a :class:`FaultPlan` per request from the seeded RNG."""

    def __init__(self, *, options: SimOptions) -> None:
        self._options = options
        self._rng = random.Random(options.seed)
        self._active = any(
            rate > 0
            for rate in (options.error_rate, options.rate_limit_rate, options.stall_rate, options.drop_rate)
        )

    def plan(self, *, steps: int) -> FaultPlan:
        """The faults for the next request, whose reply has ``steps`` token steps (>= 1)."""
        if not self._active:
            return NO_FAULTS
        o = self._options
        error, limited, stall, stall_at, drop, drop_at = (self._rng.random() for _ in range(6))
        return FaultPlan(
            error=error < o.error_rate,
            rate_limited=limited < o.rate_limit_rate,
            stall_before_step=1 + int(stall_at * steps) if stall < o.stall_rate else None,
            drop_before_step=1 + int(drop_at * steps) if drop < o.drop_rate else None,
        )
