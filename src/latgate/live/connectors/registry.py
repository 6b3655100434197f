"""Connector lookup: built-ins plus the ``latgate.live.connectors`` entry-point group (the
names: :mod:`latgate.foundation.config.connector_names`)."""

from __future__ import annotations

from latgate.foundation.config.connector_names import (
    ENTRY_POINT_GROUP,
    UnknownConnector,
    known_connectors,
    load_plugin,
)
from latgate.live.connectors.base import BUILTIN, Connector

__all__ = ["ENTRY_POINT_GROUP", "UnknownConnector", "get_connector", "known_connectors"]


def get_connector(name: str) -> Connector:
    """A connector instance for ``name``.

    Raises:
        UnknownConnector: no built-in or entry point has that name, or the entry point
            does not load to a :class:`Connector` subclass (the message says which).
    """
    cls = BUILTIN.get(name)
    if cls is not None:
        return cls()
    loaded = load_plugin(name)
    if not (isinstance(loaded, type) and issubclass(loaded, Connector)):
        raise UnknownConnector(f"connector {name!r} is not a latgate.live.connectors.Connector subclass")
    return loaded()
