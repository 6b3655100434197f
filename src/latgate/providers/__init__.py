"""Providers at run time: each provider's endpoints, their live state and keys."""

from latgate.providers.pool import EndpointState, ProviderPool, ProviderRuntime

__all__ = ["EndpointState", "ProviderPool", "ProviderRuntime"]
