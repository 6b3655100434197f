"""The shared store: what gateway replicas may share (rate limits, provider health).

``[state] redis_url`` set: :class:`RedisStore` (limits hold across every replica and
worker; :class:`HealthSync` shares endpoint ejections). Absent: :class:`MemoryStore`,
this process only. :class:`SharedStores` keeps the store across config reloads.
"""

from __future__ import annotations

from latgate.live.store.base import Quota, SharedStore, StoreUnavailable, Verdict
from latgate.live.store.health import HealthSync, run_health_sync
from latgate.live.store.memory import MemoryStore
from latgate.live.store.redis_store import RedisStore
from latgate.live.store.stores import SharedStores, open_store

__all__ = [
    "HealthSync",
    "MemoryStore",
    "Quota",
    "RedisStore",
    "SharedStore",
    "SharedStores",
    "StoreUnavailable",
    "Verdict",
    "open_store",
    "run_health_sync",
]
