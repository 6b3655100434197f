"""The shared store of the current config, kept across config reloads.

Rate-limit counters must survive a reload (else every reload would hand each key a
fresh minute), so the app keeps one store per ``[state]`` section: a reload with the
same ``[state]`` keeps the store; one that changes it gets a new store, and the old
one is closed when the app shuts down (requests of the old config may still use it).
"""

from __future__ import annotations

from latgate.foundation.config.schema import StateConfig
from latgate.foundation.retired import KeptAcrossReloads
from latgate.live.store.memory import MemoryStore
from latgate.live.store.redis_store import RedisStore

SharedStoreBackend = MemoryStore | RedisStore


def open_store(config: StateConfig) -> SharedStoreBackend:
    """The backend ``config`` asks for (no I/O: Redis connects on first use)."""
    if config.redis_url:
        return RedisStore(url=config.redis_url, timeout_seconds=config.redis_timeout_ms / 1000)
    return MemoryStore()


class SharedStores:
    """One store per distinct ``[state]`` section, for the app's lifetime."""

    def __init__(self) -> None:
        self._stores: KeptAcrossReloads[StateConfig, SharedStoreBackend] = KeptAcrossReloads(make=open_store)

    def store_for(self, config: StateConfig) -> SharedStoreBackend:
        """The store to use for ``config`` (the same object while ``config`` is equal)."""
        return self._stores.get(config)

    async def aclose(self) -> None:
        """Close every store (app shutdown)."""
        await self._stores.aclose()
