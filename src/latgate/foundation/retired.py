"""One object per distinct setting for an app's lifetime, and those a reload retired.

A reload that keeps the setting keeps the object (its warm connections, its counters);
one that changes it gets a new object. The retired one may still carry requests of the
old config, so it is closed only by :meth:`KeptAcrossReloads.aclose` at shutdown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class _Closeable(Protocol):
    async def aclose(self) -> None: ...


Setting = TypeVar("Setting")
Kept = TypeVar("Kept", bound=_Closeable)


class KeptAcrossReloads(Generic[Setting, Kept]):
    """The object made for the current ``setting``, and the retired ones.

    Args:
        make: builds the object for a setting (no I/O expected).
        on_retire: called with an object as it is replaced (e.g. to stop reusing its
            idle connections); it stays open until :meth:`aclose`.

    Example::

        clients = KeptAcrossReloads(make=lambda t: Client(timeouts=t))
        client = clients.get((1.0, 30.0))   # the same object while the setting is equal
    """

    def __init__(self, *, make: Callable[[Setting], Kept], on_retire: Callable[[Kept], None] | None = None) -> None:
        self._make = make
        self._on_retire = on_retire
        self._current: Kept | None = None
        self._setting: Setting | None = None
        self._retired: list[Kept] = []

    def get(self, setting: Setting) -> Kept:
        """The object for ``setting``: the current one while ``setting`` is equal to
        the last one asked for, else a new one (the current one is retired)."""
        if self._current is None or setting != self._setting:
            if self._current is not None:
                if self._on_retire is not None:
                    self._on_retire(self._current)
                self._retired.append(self._current)
            self._current = self._make(setting)
            self._setting = setting
        return self._current

    async def aclose(self) -> None:
        """Close every object, current and retired (app shutdown)."""
        for kept in [*self._retired, *([self._current] if self._current is not None else [])]:
            await kept.aclose()
        self._retired.clear()
        self._current = None
