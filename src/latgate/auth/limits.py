"""Per-key RPM and TPM limits.

Before the call, a request takes one unit of its key's RPM quota and an *estimate* of
its tokens from the TPM quota: latgate's prompt-token estimate plus the completion
tokens it asks for at most (``max_completion_tokens`` / ``max_tokens``), capped at
the key's TPM so one request alone always fits an idle minute. Both are taken
atomically or not at all. After the call, :meth:`Reservation.settle` corrects the TPM
charge to what the upstream reported in ``usage`` (prompt + completion tokens), or to
nothing when no upstream answered, so keys are charged for tokens really used.

A refused request gets 429 ``rate_limit_exceeded`` with ``Retry-After`` (whole
seconds, at least 1): the time until the quota has room for it. When the shared state
is unreachable the limiter fails open (admits without limits) or closed (503), as
``[state] fail_open`` says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from latgate.auth.keys import Caller
from latgate.errors import GatewayError, RateLimited
from latgate.store.base import Quota, SharedStore, StoreUnavailable

_MAX_TOKEN_FIELDS = ("max_completion_tokens", "max_tokens")


class Reservation:
    """What a request was charged; settle it once when the request has ended."""

    __slots__ = ("_estimate", "_quota", "_store")

    def __init__(self, *, store: SharedStore, quota: Quota | None, estimate: int) -> None:
        self._store = store
        self._quota = quota
        self._estimate = estimate

    async def settle(self, *, used_tokens: int) -> None:
        """Correct the TPM charge from the estimate to ``used_tokens`` (prompt +
        completion tokens the upstream reported; 0 when none answered). Idempotent."""
        quota, self._quota = self._quota, None
        if quota is not None and used_tokens != self._estimate:
            await self._store.adjust(quota, delta=used_tokens - self._estimate)


class RateLimiter:
    """Admits requests within their key's RPM and TPM.

    Args:
        store: where quotas live (in-process or Redis).
        fail_open: when ``store`` is unreachable, admit (True) or refuse with 503.
    """

    def __init__(self, *, store: SharedStore, fail_open: bool) -> None:
        self._store = store
        self._fail_open = fail_open

    async def admit_request(self, caller: Caller) -> None:
        """Charge one request of ``caller``'s RPM only, before its body is read and
        counted (a key over its request rate is refused at the cost of a lookup); then
        :meth:`admit` with ``requests_charged=True`` charges its tokens.

        Raises:
            RateLimited, GatewayError: as :meth:`admit`.
        """
        if caller.rpm is not None:
            await self._acquire(caller, [Quota(key=f"rl:{{{caller.name}}}:rpm", limit=caller.rpm, cost=1)])

    async def admit(
        self, caller: Caller, *, body: Mapping[str, Any], prompt_tokens: int, requests_charged: bool = False
    ) -> Reservation | None:
        """Charge one request of ``caller`` (see the module docstring).

        Args:
            caller: an authenticated key with at least one limit.
            body: the OpenAI-shaped request body (its max-token fields are read).
            prompt_tokens: latgate's prompt-token estimate for it.
            requests_charged: :meth:`admit_request` took its RPM unit already.

        Returns:
            the reservation to settle after the call; ``None`` when nothing needs
            settling (no TPM limit, or admitted without limits by failing open).

        Raises:
            RateLimited: 429 with ``Retry-After``, naming the key and the limit.
            GatewayError: 503 ``rate_limit_state_unavailable`` when the state is
                unreachable and ``fail_open`` is false.
        """
        quotas: list[Quota] = []
        if caller.rpm is not None and not requests_charged:
            quotas.append(Quota(key=f"rl:{{{caller.name}}}:rpm", limit=caller.rpm, cost=1))
        tpm_quota: Quota | None = None
        estimate = 0
        if caller.tpm is not None:
            estimate = estimate_tokens(body, prompt_tokens=prompt_tokens, cap=caller.tpm)
            tpm_quota = Quota(key=f"rl:{{{caller.name}}}:tpm", limit=caller.tpm, cost=estimate)
            quotas.append(tpm_quota)
        if not quotas or not await self._acquire(caller, quotas) or tpm_quota is None:
            return None
        return Reservation(store=self._store, quota=tpm_quota, estimate=estimate)

    async def _acquire(self, caller: Caller, quotas: list[Quota]) -> bool:
        """Take ``quotas`` atomically; False when admitted without limits (failing open).

        Raises:
            RateLimited: a quota has no room (429 with ``Retry-After``).
            GatewayError: 503 when the state is unreachable and not failing open.
        """
        try:
            verdict = await self._store.acquire(quotas)
        except StoreUnavailable:
            if self._fail_open:
                return False
            raise GatewayError(
                "rate limits cannot be checked right now (shared state unavailable); retry shortly",
                status=503,
                code="rate_limit_state_unavailable",
                headers={"retry-after": "1"},
            ) from None
        if not verdict.allowed:
            raise _refusal(caller, verdict.retry_after_seconds)
        return True


def estimate_tokens(body: Mapping[str, Any], *, prompt_tokens: int, cap: int) -> int:
    """Tokens a request may use: prompt estimate + its completion token cap, at most ``cap``."""
    completion = 0
    for field in _MAX_TOKEN_FIELDS:
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            completion = value
            break
    return max(0, min(prompt_tokens + completion, cap))


def _refusal(caller: Caller, retry_after_seconds: float) -> RateLimited:
    seconds = max(1, math.ceil(retry_after_seconds))
    limits = []
    if caller.rpm is not None:
        limits.append(f"{caller.rpm} requests")
    if caller.tpm is not None:
        limits.append(f"{caller.tpm} tokens")
    return RateLimited(
        f"rate limit reached for key {caller.name!r} ({' and '.join(limits)} per minute); retry after {seconds} s",
        headers={"retry-after": str(seconds)},
    )
