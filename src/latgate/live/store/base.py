"""What every shared store offers: atomic rate-limit quotas, and the types they use.

Rate limits use GCRA (the generic cell rate algorithm, ITU-T I.371; the "leaky bucket
as a meter"): a quota of ``limit`` units per ``window_seconds`` is one number per key,
the *theoretical arrival time* (TAT). Taking ``cost`` units moves the TAT forward by
``cost * window_seconds / limit``; a request is refused when that would put the TAT
more than one window ahead of now, and the overshoot is exactly how long the caller
must wait (``Retry-After``). So a full window's worth may be taken at once (a burst of
``limit``), after which units come back smoothly at ``limit / window_seconds`` per
second. One number per key makes every operation a single atomic step, in process
or in one Redis script.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

WINDOW_SECONDS = 60.0
"""RPM and TPM are per minute."""

EPSILON_SECONDS = 1e-9
"""An overshoot up to this is rounding, not a refusal (the Redis script uses the same)."""


class StoreUnavailable(Exception):
    """The shared store could not be reached in time (or is in its back-off
    period after a failure). The message names no address."""


@dataclass(frozen=True, slots=True)
class Quota:
    """One limit to charge.

    Attributes:
        key: the counter's name, e.g. ``team-a:rpm`` (unique per key and kind).
        limit: units allowed per window (> 0): requests for RPM, tokens for TPM.
        cost: units this request takes now (>= 0; callers cap it at ``limit`` so an
            idle quota always admits it).
        window_seconds: the window, 60 for per-minute limits.
    """

    key: str
    limit: int
    cost: float
    window_seconds: float = WINDOW_SECONDS


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer to :meth:`SharedStore.acquire`.

    Attributes:
        allowed: every quota had room and all were charged; ``False``: none was.
        retry_after_seconds: when refused, the wait until all would have room
            (> 0); 0 when allowed.
        room_in_seconds: per quota, in the order given, the wait after this verdict
            until a charge of the same cost would fit that quota alone (0: it would
            now); empty when the store does not say. Other replicas only add to a
            quota, so a wait seen here is never too long for a quota nothing gives
            back (RPM: :class:`latgate.request.auth.RateLimiter` refuses on it before a body
            is read).
    """

    allowed: bool
    retry_after_seconds: float = 0.0
    room_in_seconds: tuple[float, ...] = ()


ALLOWED = Verdict(allowed=True)


class SharedStore(Protocol):
    """A shared store of rate-limit counters (in-process or Redis).

    Attributes:
        shared: True when several gateway replicas see the same counters.
    """

    shared: bool

    async def acquire(self, quotas: Sequence[Quota]) -> Verdict:
        """Charge every quota, or none of them (atomically).

        Raises:
            StoreUnavailable: the backend cannot be reached (Redis only).
        """
        ...

    async def adjust(self, quota: Quota, *, delta: float) -> None:
        """Correct a past charge by ``delta`` units (negative gives units back), e.g.
        once the upstream reported the real token usage. The correction is applied
        with the next charge of the same quota (Redis: or on its own within a second),
        bounded as :func:`corrected_tat` says. Never raises: a correction lost to an
        outage is only logged."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def gcra_charge(
    tat: float, now: float, *, cost: float, limit: int, window_seconds: float
) -> tuple[float, float]:
    """One GCRA step for one quota.

    Args:
        tat: the stored theoretical arrival time (seconds; anything <= ``now`` means
            the quota is full).
        now: the current time, same clock.
        cost, limit, window_seconds: as in :class:`Quota`.

    Returns:
        ``(new_tat, over_seconds)``: the TAT after charging, and by how many seconds
        it would overshoot the window (<= 0: allowed; > 0: refused, retry after it).
    """
    new_tat = max(tat, now) + cost * window_seconds / limit
    return new_tat, new_tat - now - window_seconds


def room_in(new_tat: float, now: float, *, step_seconds: float, window_seconds: float) -> float:
    """Seconds from ``now`` until a charge of ``step_seconds`` (``cost * window / limit``)
    fits a quota whose TAT is ``new_tat`` (0: it fits now)."""
    over = new_tat + step_seconds - now - window_seconds
    return over if over > EPSILON_SECONDS else 0.0


def corrected_tat(tat: float, now: float, *, correction_seconds: float, window_seconds: float) -> float:
    """The TAT after correcting past charges by ``correction_seconds`` (``delta * window /
    limit``; negative gives units back): never before ``now``, and never more than one
    window ahead of it.

    The upper bound is the debt a quota carries forward: a request that used more than
    it was charged (a stream longer than expected) fills the quota at worst, so the
    next charge of ``cost`` waits at most ``cost * window / limit`` (<= one window,
    60 s), however far the usage overshot. Without it a burst of long answers locked a
    key out for minutes. The Redis script applies the same bound."""
    return min(max(max(tat, now) + correction_seconds, now), now + window_seconds)

