"""Connectors: the adapter latgate uses to talk to one provider's engine or upstream.

``connector = "NAME"`` in a provider section picks one. Built in: ``openai`` (generic
OpenAI-compatible, the default), ``vllm``, ``sglang`` and ``tile_rt_connector``; the
engine-specific ones speak the same OpenAI wire format today and are where engine load
signals (vLLM ``/metrics`` gauges, SGLang's equivalents) live. Third-party connectors
register a :class:`Connector` subclass in the entry-point group ``latgate.live.connectors``.
"""

from latgate.live.connectors.base import Connector
from latgate.live.connectors.registry import (
    ENTRY_POINT_GROUP,
    UnknownConnector,
    get_connector,
    known_connectors,
)

__all__ = ["ENTRY_POINT_GROUP", "Connector", "UnknownConnector", "get_connector", "known_connectors"]
