"""Run-time state that may be shared by gateway replicas: rate limits, provider health.

``[state] redis_url`` set: :class:`RedisState` (limits hold across every replica and
worker; :class:`HealthSync` shares endpoint ejections). Absent: :class:`MemoryState`,
this process only. :class:`StateStores` keeps the store across config reloads.
"""

from __future__ import annotations

from latgate.state.base import Quota, StateStore, StateUnavailable, Verdict
from latgate.state.health import HealthSync, run_health_sync
from latgate.state.memory import MemoryState
from latgate.state.redis_store import RedisState
from latgate.state.stores import StateStores, open_state

__all__ = [
    "HealthSync",
    "MemoryState",
    "Quota",
    "RedisState",
    "StateStore",
    "StateStores",
    "StateUnavailable",
    "Verdict",
    "open_state",
    "run_health_sync",
]
