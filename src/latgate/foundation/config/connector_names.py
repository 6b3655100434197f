"""The connector names a config may use: the built-ins' and those registered in the
``latgate.live.connectors`` entry-point group by other packages. The config loader checks a
provider's ``connector`` against them at load; :mod:`latgate.live.connectors.registry` turns a
name into a :class:`~latgate.live.connectors.base.Connector` (and checks that a plugin's class
is one)."""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = "latgate.live.connectors"

#: the built-in connectors' names, in the order they are listed (each a
#: :data:`latgate.live.connectors.base.BUILTIN` key; tests/test_connectors.py checks they agree)
BUILTIN_NAMES = ("openai", "vllm", "sglang", "tile_rt_connector")


class UnknownConnector(LookupError):
    """A connector name nobody registered, or a plugin that does not load (the message
    says which)."""


@functools.cache
def _plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_connectors() -> list[str]:
    """Every connector name that can be configured, built-ins first."""
    return list(BUILTIN_NAMES) + sorted(n for n in _plugins() if n not in BUILTIN_NAMES)


def load_plugin(name: str) -> object:
    """What the entry point ``name`` of the group loads to (a class, if it is sound).

    Raises:
        UnknownConnector: no entry point has that name, or loading it raised (its type
            and message are given).
    """
    ep = _plugins().get(name)
    if ep is None:
        raise UnknownConnector(f"unknown connector {name!r}; known: {', '.join(known_connectors())}")
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - plugin code raises anything; it must not start silently
        raise UnknownConnector(f"connector {name!r} failed to load: {type(exc).__name__}: {exc}") from None
