"""Gateway keys: who is calling, from the key they present.

Clients present a key as ``Authorization: Bearer KEY`` (OpenAI SDKs, Claude Code's
``ANTHROPIC_AUTH_TOKEN``) or ``x-api-key: KEY`` (Anthropic SDKs). Keys are compared as
SHA-256 digests: the config may hold the digest only (``key_sha256``), and the
presented key is hashed and compared with :func:`hmac.compare_digest` against every
configured digest, with no early exit, so the time taken does not depend on which key
matched or how much of a digest agreed.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from latgate.foundation.config.schema import AuthKey

MAX_KEY_BYTES = 1024
"""Longer presented keys are refused unhashed (no configured key is that long)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated gateway key, as the request path needs it.

    Attributes:
        name: the key's ``name`` (logs, metrics, messages; never the key itself).
        admin: may read ``/admin/*``.
        policy: default route policy for this key (``Router.decide(key_policy=)``).
        models: the allow-list of public model names; ``None``: any model.
        rpm: requests per minute, or ``None`` for no limit.
        tpm: tokens (prompt + completion) per minute, or ``None`` for no limit.
        priority: the highest priority class its requests may claim
            (``interactive``/``default``/``batch``, :mod:`latgate.routing.priority`),
            or ``None`` for no ceiling.
    """

    name: str
    admin: bool = False
    policy: str | None = None
    models: frozenset[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    priority: str | None = None

    @property
    def limited(self) -> bool:
        """True when an RPM or TPM limit applies."""
        return self.rpm is not None or self.tpm is not None

    def may_use(self, model: str) -> bool:
        """True when ``model`` (the public name) is on this key's allow-list."""
        return self.models is None or model in self.models


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key in ``Authorization: Bearer ...`` (scheme case-insensitive), else in
    ``x-api-key``; ``None`` when neither carries one. ``headers`` are looked up by
    lowercase name (Starlette ``Headers`` or a lowercase dict)."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = headers.get("x-api-key")
    if api_key and api_key.strip():
        return api_key.strip()
    return None


def key_digest(key: str) -> bytes:
    """SHA-256 of a key's bytes. Header values arrive decoded as Latin-1, so
    ``latin-1`` recovers the bytes sent; config keys are UTF-8 text.

    Example: ``key_digest("sk-team-a").hex()`` is what ``key_sha256`` holds
    (``printf %s sk-team-a | sha256sum``).
    """
    return hashlib.sha256(key.encode("utf-8")).digest()


class KeyRing:
    """The configured keys, by digest.

    Args:
        keys: the ``[[auth.keys]]`` entries (validated by the config loader: each has
            exactly one of ``key`` / ``key_sha256``, names are unique).
    """

    def __init__(self, keys: Sequence[AuthKey]) -> None:
        self._entries: tuple[tuple[bytes, Caller], ...] = tuple((_digest_of(k), _caller(k)) for k in keys)

    def match(self, presented: str) -> Caller | None:
        """The caller whose key is ``presented``, or ``None``; constant time in which
        key matched (every digest is compared)."""
        raw = presented.encode("latin-1", "replace")
        if len(raw) > MAX_KEY_BYTES:
            return None
        digest = hashlib.sha256(raw).digest()
        found: Caller | None = None
        for stored, caller in self._entries:
            if hmac.compare_digest(digest, stored):
                found = caller
        return found

    def callers(self) -> list[Caller]:
        """Every configured caller, in file order."""
        return [caller for _, caller in self._entries]


def _digest_of(key: AuthKey) -> bytes:
    if key.key_sha256 is not None:
        return bytes.fromhex(key.key_sha256)
    assert key.key is not None
    return key_digest(key.key)


def _caller(key: AuthKey) -> Caller:
    return Caller(
        name=key.name,
        admin=key.admin,
        policy=key.policy,
        models=frozenset(key.models) if key.models else None,
        rpm=key.rpm,
        tpm=key.tpm,
        priority=key.priority,
    )
