"""Providers at run time: each provider's endpoints, their live state, health and keys,
and the selection of the endpoint a request goes to."""

from latgate.providers.pool import ProviderPool, ProviderRuntime, Ticket
from latgate.providers.state import EndpointState

__all__ = ["EndpointState", "ProviderPool", "ProviderRuntime", "Ticket"]
