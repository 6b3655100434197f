"""Run-time state of providers and their endpoints (replicas).

The config says what exists; this module tracks what is happening: requests in flight
per endpoint, consecutive failures, and the provider's key read from its environment
variable once at start. Endpoint choice here is deliberately simple (fewest in flight,
round-robin among equals); latency-aware choice builds on this state.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from latgate.config.schema import Config, EndpointConfig, ProviderConfig
from latgate.connectors import Connector, get_connector
from latgate.metrics import Metrics


@dataclass(slots=True)
class EndpointState:
    """Live numbers of one endpoint. ``in_flight`` counts requests being served."""

    config: EndpointConfig
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    healthy: bool = True


@dataclass(slots=True)
class ProviderRuntime:
    """One provider: its config, connector, endpoints' state and upstream auth header.

    ``auth_headers`` holds ``Authorization: Bearer <key>`` when ``api_key_env`` is set
    in the environment, else nothing. It is never logged nor sent to a client.
    """

    config: ProviderConfig
    connector: Connector
    endpoints: list[EndpointState]
    auth_headers: dict[str, str] = field(default_factory=dict)
    _next: int = 0

    @property
    def name(self) -> str:
        return self.config.name

    def pick_endpoint(self) -> EndpointState:
        """The healthy endpoint with the fewest requests in flight (round-robin on ties)."""
        endpoints = self.endpoints
        if len(endpoints) == 1:
            return endpoints[0]
        n = len(endpoints)
        start = self._next
        self._next = (start + 1) % n
        best: EndpointState | None = None
        for i in range(n):
            ep = endpoints[(start + i) % n]
            if not ep.healthy and best is not None:
                continue
            if best is None or (ep.healthy and not best.healthy) or ep.in_flight < best.in_flight:
                best = ep
        assert best is not None
        return best


class ProviderPool:
    """All providers of a config, by name.

    Args:
        config: the resolved config.
        metrics: where in-flight gauges and endpoint health are exported.
        env: where ``api_key_env`` variables are read (``os.environ`` by default).
    """

    def __init__(self, config: Config, *, metrics: Metrics, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._metrics = metrics
        self.providers: dict[str, ProviderRuntime] = {}
        for name, provider in config.providers.items():
            key = env.get(provider.api_key_env, "") if provider.api_key_env else ""
            runtime = ProviderRuntime(
                config=provider,
                connector=get_connector(provider.connector),
                endpoints=[EndpointState(config=ep) for ep in provider.endpoints],
                auth_headers={"authorization": f"Bearer {key}"} if key else {},
            )
            self.providers[name] = runtime
            for ep in provider.endpoints:
                metrics.set_endpoint_health(provider=name, endpoint=ep.id, healthy=True)

    def __getitem__(self, name: str) -> ProviderRuntime:
        return self.providers[name]

    def any_healthy(self) -> bool:
        """True when at least one endpoint of any provider can take traffic."""
        return any(ep.healthy for p in self.providers.values() for ep in p.endpoints)

    @contextlib.asynccontextmanager
    async def in_flight(self, provider: ProviderRuntime, endpoint: EndpointState) -> AsyncIterator[None]:
        """Count a request in flight on ``endpoint`` for as long as the block runs."""
        gauge = self._metrics.in_flight_gauge(provider.name)
        endpoint.in_flight += 1
        endpoint.requests += 1
        gauge.inc()
        try:
            yield
        finally:
            endpoint.in_flight -= 1
            gauge.dec()

    def record_outcome(self, provider: ProviderRuntime, endpoint: EndpointState, *, ok: bool) -> None:
        """Passive health: after 5 consecutive upstream failures an endpoint is marked unhealthy
        (it stays selectable when no other is healthy); one success restores it."""
        if ok:
            endpoint.consecutive_failures = 0
            if not endpoint.healthy:
                endpoint.healthy = True
                self._metrics.set_endpoint_health(provider=provider.name, endpoint=endpoint.config.id, healthy=True)
            return
        endpoint.failures += 1
        endpoint.consecutive_failures += 1
        if endpoint.healthy and endpoint.consecutive_failures >= 5:
            endpoint.healthy = False
            self._metrics.set_endpoint_health(provider=provider.name, endpoint=endpoint.config.id, healthy=False)
