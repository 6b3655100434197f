"""Per-key RPM and TPM limits.

Before the call, a request takes one unit of its key's RPM quota and an *estimate* of
its tokens from the TPM quota: latgate's prompt-token estimate plus the completion
tokens routing expects of it (computed once per request:
:meth:`latgate.routing.selection.Selector.expected_completion`: what its key's recent
streams produced, at most its ``max_completion_tokens`` / ``max_tokens`` /
``max_output_tokens``; before any stream that cap, else ``[routing]
expected_completion_tokens``), the completion at most what the model's context window
(``[models.X] max_context_tokens``) leaves after the prompt, the whole capped at the
key's TPM so one request alone always fits an idle minute. So a burst of requests that
name no ``max_tokens`` is admitted for what they are expected to use, not for their
prompts alone. Both are taken
atomically or not at all, in one call to the store once the body is read; before it
is read, a key whose last charge on this replica left no room for another request is
refused without a call (:meth:`RateLimiter.check_request_rate`). After the call,
:meth:`Reservation.settle` corrects the TPM charge to what the upstream reported in
``usage`` (prompt + completion tokens; the tokens streamed before a client left or a
stream broke), or to nothing when no upstream answered, so keys are charged for tokens
really used. A request that used more than it was charged leaves its key in debt, but
never more than one window's worth (:func:`latgate.live.store.base.corrected_tat`): after a
correction the key is at worst full, and its next request waits at most its own share
of the minute (at most 60 s), however far the upstream overshot.

A refused request gets 429 ``rate_limit_exceeded`` with ``Retry-After`` (whole
seconds, at least 1): the time until the quota has room for it. When the shared state
is unreachable the limiter fails open (admits without limits) or closed (503), as
``[state] fail_open`` says.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

from latgate.foundation.errors import GatewayError, RateLimited
from latgate.live.store.base import Quota, SharedStore, StoreUnavailable
from latgate.request.auth.keys import Caller


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
        clock: monotonic seconds, for the waits the store reports (tests inject one).
    """

    def __init__(self, *, store: SharedStore, fail_open: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._fail_open = fail_open
        self._clock = clock
        # key name -> (its rpm, clock time before which another request cannot fit):
        # from the store's last verdict for it on this replica (see check_request_rate)
        self._requests_full_until: dict[str, tuple[int, float]] = {}

    def check_request_rate(self, caller: Caller) -> None:
        """Refuse ``caller`` before its body is read when its last charge on this
        replica said its RPM has no room yet, at the cost of a lookup and no call to the
        store. Other replicas only add to a request count (nothing gives requests
        back), so this never refuses a request :meth:`admit` would have admitted;
        one it lets through is decided there.

        Raises:
            RateLimited: 429 with ``Retry-After``, naming the key and the limit.
        """
        known = self._requests_full_until.get(caller.name)
        if known is not None:
            rpm, until = known
            wait = until - self._clock()
            if rpm == caller.rpm and wait > 0:
                raise _refusal(caller, wait)
            del self._requests_full_until[caller.name]

    async def admit(
        self,
        caller: Caller,
        *,
        prompt_tokens: int,
        completion_tokens: int = 0,
        context_tokens: int | None = None,
    ) -> Reservation | None:
        """Charge one request of ``caller`` (see the module docstring): its RPM unit and
        its token estimate, in one call to the store.

        Args:
            caller: an authenticated key with at least one limit.
            prompt_tokens: latgate's prompt-token estimate for it.
            completion_tokens, context_tokens: as :func:`estimate_tokens` takes them.

        Returns:
            the reservation to settle after the call; ``None`` when nothing needs
            settling (no TPM limit, or admitted without limits by failing open).

        Raises:
            RateLimited: 429 with ``Retry-After``, naming the key and the limit.
            GatewayError: 503 ``rate_limit_state_unavailable`` when the state is
                unreachable and ``fail_open`` is false.
        """
        rpm_key, tpm_key = _quota_keys(caller.name)
        quotas: list[Quota] = []
        if caller.rpm is not None:
            quotas.append(Quota(key=rpm_key, limit=caller.rpm, cost=1))
        tpm_quota: Quota | None = None
        estimate = 0
        if caller.tpm is not None:
            estimate = estimate_tokens(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cap=caller.tpm,
                context_tokens=context_tokens,
            )
            tpm_quota = Quota(key=tpm_key, limit=caller.tpm, cost=estimate)
            quotas.append(tpm_quota)
        if not quotas or not await self._acquire(caller, quotas) or tpm_quota is None:
            return None
        return Reservation(store=self._store, quota=tpm_quota, estimate=estimate)

    async def admit_request(self, caller: Caller) -> None:
        """Charge one request of ``caller``'s RPM alone: a request latgate answers
        itself or refuses before :meth:`admit` (every request counts).

        Raises:
            RateLimited, GatewayError: as :meth:`admit`.
        """
        if caller.rpm is not None:
            await self._acquire(caller, [Quota(key=_quota_keys(caller.name)[0], limit=caller.rpm, cost=1)])

    async def _acquire(self, caller: Caller, quotas: list[Quota]) -> bool:
        """Take ``quotas`` atomically; False when admitted without limits (failing open).

        Raises:
            RateLimited: a quota has no room (429 with ``Retry-After``).
            GatewayError: 503 when the state is unreachable and not failing open.
        """
        asked_at = self._clock()
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
        if caller.rpm is not None and verdict.room_in_seconds:
            wait = verdict.room_in_seconds[0]  # the RPM quota's; measured from before the call
            if wait > 0:
                self._requests_full_until[caller.name] = (caller.rpm, asked_at + wait)
        if not verdict.allowed:
            raise _refusal(caller, verdict.retry_after_seconds)
        return True


@functools.lru_cache(maxsize=4096)
def _quota_keys(name: str) -> tuple[str, str]:
    """The RPM and TPM quota keys of the key named ``name`` (one hash tag: one slot)."""
    return f"rl:{{{name}}}:rpm", f"rl:{{{name}}}:tpm"


def estimate_tokens(
    *, prompt_tokens: int, completion_tokens: int, cap: int, context_tokens: int | None = None
) -> int:
    """Tokens a request is charged before its call: ``prompt_tokens`` + the
    ``completion_tokens`` routing expects of it (the request's one
    :meth:`~latgate.routing.selection.Selector.expected_completion`), the completion at
    most ``context_tokens - prompt_tokens`` when the model's window is known
    (``context_tokens``), the whole at most ``cap`` (the key's TPM)."""
    completion = completion_tokens
    if context_tokens is not None:
        completion = min(completion, max(0, context_tokens - prompt_tokens))
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
