"""Providers at run time: each provider's endpoints, their live numbers, circuits and
keys. Where a request goes is :mod:`latgate.routing`."""

from latgate.live.providers.endpoint import EndpointRuntime
from latgate.live.providers.pool import ProviderPool
from latgate.live.providers.runtime import ProviderRuntime
from latgate.live.providers.ticket import Ticket

__all__ = ["EndpointRuntime", "ProviderPool", "ProviderRuntime", "Ticket"]
