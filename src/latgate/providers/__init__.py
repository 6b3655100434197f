"""Providers at run time: each provider's endpoints, their live numbers, circuits and
keys. Where a request goes is :mod:`latgate.routing`."""

from latgate.providers.endpoint import EndpointRuntime
from latgate.providers.pool import ProviderPool
from latgate.providers.runtime import ProviderRuntime
from latgate.providers.ticket import Ticket

__all__ = ["EndpointRuntime", "ProviderPool", "ProviderRuntime", "Ticket"]
