"""The gateway's door: authentication, per-key model allow-lists, admin rights and
rate limits, in the order a request meets them.

Errors are gateway errors, rendered by each API in its own envelope: 401
``authentication_error`` (no key, unknown key; with ``WWW-Authenticate: Bearer`` as
RFC 6750 section 3 asks), 403 ``permission_error`` (model not on the key's allow-list,
admin route with a non-admin key), 429 ``rate_limit_error`` with ``Retry-After``.
Messages name the key by its configured ``name``, never echo the presented key.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from latgate.forwarding.exchange import Exchange
from latgate.foundation.config.schema import AuthConfig
from latgate.foundation.errors import AuthenticationFailed, PermissionDenied
from latgate.live.store.base import SharedStore
from latgate.request.auth.keys import Caller, KeyRing, presented_key
from latgate.request.auth.limits import RateLimiter, Reservation

log = logging.getLogger("latgate.auth")
_CHALLENGE = {"www-authenticate": 'Bearer realm="latgate"'}


class AuthGuard:
    """Built once per app from ``[auth]``; absent ``[auth]`` means no guard at all.

    Args:
        config: the ``[auth]`` section.
        store: rate-limit state (in-process or Redis).
        fail_open: admit without limits when ``store`` is unreachable (else 503).

    Example::

        caller = guard.authenticate(request.headers)         # 401
        guard.check_model(caller, decision.public_model)     # 403
        reservation = await guard.admit(caller, prompt_tokens=n, completion_tokens=m)  # 429
    """

    def __init__(self, *, config: AuthConfig, store: SharedStore, fail_open: bool) -> None:
        self.keys = KeyRing(config.keys)
        self.limiter = RateLimiter(store=store, fail_open=fail_open)

    def authenticate(self, headers: Mapping[str, str]) -> Caller:
        """The caller presenting a configured key in ``headers``.

        Raises:
            AuthenticationFailed: no key (code ``missing_api_key``) or an unknown one
                (``invalid_api_key``); 401 with ``WWW-Authenticate``.
        """
        key = presented_key(headers)
        if key is None:
            raise AuthenticationFailed(
                "no API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                code="missing_api_key",
                headers=dict(_CHALLENGE),
            )
        caller = self.keys.match(key)
        if caller is None:
            raise AuthenticationFailed("invalid API key", code="invalid_api_key", headers=dict(_CHALLENGE))
        return caller

    def authorize_admin(self, headers: Mapping[str, str]) -> Caller:
        """The caller, when its key may read ``/admin/*``.

        Raises:
            AuthenticationFailed: as :meth:`authenticate`.
            PermissionDenied: a valid key without ``admin = true`` (403).
        """
        caller = self.authenticate(headers)
        if not caller.admin:
            raise PermissionDenied(f"key {caller.name!r} is not an admin key", code="admin_key_required")
        return caller

    @staticmethod
    def check_model(caller: Caller, model: str) -> None:
        """Raises PermissionDenied (403, param ``model``) when ``model`` (the public
        name the client asked for) is not on the caller's allow-list."""
        if not caller.may_use(model):
            allowed = ", ".join(sorted(caller.models or ()))
            raise PermissionDenied(
                f"key {caller.name!r} may not use model {model!r}; allowed: {allowed}",
                param="model",
                code="model_not_allowed",
            )

    def check_request_rate(self, caller: Caller) -> None:
        """Refuse (429) before the body is read a caller known to be over its RPM (see
        :meth:`RateLimiter.check_request_rate`)."""
        self.limiter.check_request_rate(caller)

    async def admit_request(self, caller: Caller) -> None:
        """Charge the caller's RPM alone, for a request that is not forwarded (see
        :meth:`RateLimiter.admit_request`)."""
        await self.limiter.admit_request(caller)

    async def admit(
        self,
        caller: Caller,
        *,
        prompt_tokens: int,
        completion_tokens: int = 0,
        context_tokens: int | None = None,
    ) -> Reservation | None:
        """Charge the caller's RPM/TPM (see :meth:`RateLimiter.admit`)."""
        return await self.limiter.admit(
            caller, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, context_tokens=context_tokens
        )


async def forward_within_limits(
    reservation: Reservation, exchange: Exchange, forward: Callable[[], Awaitable[Any]]
) -> Any:
    """Run ``forward`` (returns an ASGI response) and settle ``reservation`` with the
    tokens the request really used: at once for a whole answer or a failure, at the
    end of the stream for a stream."""
    try:
        response = await forward()
    except Exception:
        await _settle(reservation, exchange)
        raise
    if not exchange.stream or exchange.finished:
        await _settle(reservation, exchange)
        return response
    return _SettleAfter(response, reservation, exchange)


def used_tokens(exchange: Exchange) -> int:
    """Prompt + completion tokens of a request that reached an upstream (the upstream's
    ``usage`` when it sent one), 0 when no upstream answered."""
    if exchange.status == 200 or exchange.first_token_at is not None:
        return exchange.prompt_tokens + exchange.completion_tokens
    return 0


async def _settle(reservation: Reservation, exchange: Exchange) -> None:
    try:
        await reservation.settle(used_tokens=used_tokens(exchange))
    except Exception as exc:  # noqa: BLE001 (a lost correction must not fail the request)
        log.warning("token usage correction failed (%s)", type(exc).__name__)


class _SettleAfter:
    """An ASGI response that runs ``app`` (a stream relay) and then settles."""

    __slots__ = ("_app", "_exchange", "_reservation")

    def __init__(self, app: Any, reservation: Reservation, exchange: Exchange) -> None:
        self._app = app
        self._reservation = reservation
        self._exchange = exchange

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await self._app(scope, receive, send)
        finally:
            with contextlib.suppress(BaseException):
                await _settle(self._reservation, self._exchange)
