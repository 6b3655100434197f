"""Rendezvous hashing: a stable endpoint for a session among equals.

Each endpoint scores ``mix(key ^ salt)`` and the highest wins (Thaler and Ravishankar,
"Using name-based mappings to increase hit rates", 1998): different sessions spread
over the endpoints, one session always scores the same one highest, and removing an
endpoint moves only the sessions it had. The predicted-latency choice uses it between
endpoints predicted alike and equally loaded (:mod:`.predicted_ttft`).
"""

from __future__ import annotations

import zlib

_MASK = (1 << 64) - 1


def endpoint_salt(endpoint_id: str) -> int:
    """The stable per-endpoint number rendezvous hashing mixes in.

    Example::

        endpoint_salt("pool-0") == endpoint_salt("pool-0")  # True, in every process
    """
    return zlib.crc32(endpoint_id.encode()) * 0x9E3779B97F4A7C15 & _MASK


def rendezvous_score(key: int, salt: int) -> int:
    """The score of the endpoint with ``salt`` for ``key`` (splitmix64's finaliser over
    ``key ^ salt``: a well-mixed 64-bit number).

    Example::

        salts = [endpoint_salt(f"pool-{i}") for i in range(3)]
        max(range(3), key=lambda i: rendezvous_score(42, salts[i]))  # the same index every time
    """
    value = (key ^ salt) & _MASK
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK
    return value ^ (value >> 31)
