"""The state store of the current config, kept across config reloads.

Rate-limit counters must survive a reload (else every reload would hand each key a
fresh minute), so the app keeps one store per ``[state]`` section: a reload with the
same ``[state]`` keeps the store; one that changes it gets a new store, and the old
one is closed when the app shuts down (requests of the old config may still use it).
"""

from __future__ import annotations

from latgate.config.schema import StateConfig
from latgate.state.memory import MemoryState
from latgate.state.redis_store import RedisState

StateBackend = MemoryState | RedisState


def open_state(config: StateConfig) -> StateBackend:
    """The backend ``config`` asks for (no I/O: Redis connects on first use)."""
    if config.redis_url:
        return RedisState(url=config.redis_url, timeout_seconds=config.redis_timeout_ms / 1000)
    return MemoryState()


class StateStores:
    """One store per distinct ``[state]`` section, for the app's lifetime."""

    def __init__(self) -> None:
        self._current: StateBackend | None = None
        self._config: StateConfig | None = None
        self._retired: list[StateBackend] = []

    def store_for(self, config: StateConfig) -> StateBackend:
        """The store to use for ``config`` (the same object while ``config`` is equal)."""
        if self._current is None or config != self._config:
            if self._current is not None:
                self._retired.append(self._current)
            self._current = open_state(config)
            self._config = config
        return self._current

    async def aclose(self) -> None:
        """Close every store (app shutdown)."""
        for store in [*self._retired, *([self._current] if self._current else [])]:
            await store.aclose()
        self._retired.clear()
        self._current = None
