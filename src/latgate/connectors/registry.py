"""Connector lookup: built-ins plus the ``latgate.connectors`` entry-point group."""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points

from latgate.connectors.base import BUILTIN, Connector

ENTRY_POINT_GROUP = "latgate.connectors"


class UnknownConnector(LookupError):
    """Raised by :func:`get_connector` for a name nobody registered."""


@functools.cache
def _plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_connectors() -> list[str]:
    """Every connector name that can be configured, built-ins first."""
    return list(BUILTIN) + sorted(n for n in _plugins() if n not in BUILTIN)


def get_connector(name: str) -> Connector:
    """A connector instance for ``name``.

    Raises:
        UnknownConnector: no built-in or entry point has that name, or the entry point
            does not load to a :class:`Connector` subclass (the message says which).
    """
    cls = BUILTIN.get(name)
    if cls is None:
        ep = _plugins().get(name)
        if ep is None:
            raise UnknownConnector(f"unknown connector {name!r}; known: {', '.join(known_connectors())}")
        try:
            cls = ep.load()
        except Exception as exc:  # noqa: BLE001 - plugin code raises anything; it must not start silently
            raise UnknownConnector(f"connector {name!r} failed to load: {type(exc).__name__}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, Connector)):
            raise UnknownConnector(f"connector {name!r} is not a latgate.connectors.Connector subclass")
    return cls()
