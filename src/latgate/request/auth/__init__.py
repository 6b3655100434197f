"""Gateway keys (``[[auth.keys]]``): authentication, per-key policy, model allow-lists,
admin rights and RPM/TPM limits. No ``[auth]`` section: no guard, and nothing of this
package runs per request."""

from __future__ import annotations

from latgate.request.auth.guard import AuthGuard, forward_within_limits, used_tokens
from latgate.request.auth.keys import Caller, KeyRing, key_digest, presented_key
from latgate.request.auth.limits import RateLimiter, Reservation, estimate_tokens

__all__ = [
    "AuthGuard",
    "Caller",
    "KeyRing",
    "RateLimiter",
    "Reservation",
    "estimate_tokens",
    "forward_within_limits",
    "key_digest",
    "presented_key",
    "used_tokens",
]
