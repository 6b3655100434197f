"""A clock a test moves by hand, for the time-driven policies (circuit breakers, rate
limits, admission, evidence windows): pure functions of the time they are given."""

from __future__ import annotations


class ManualClock:
    """Call it for the time in seconds; the test sets or adds to :attr:`now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
