"""Provider health shared by replicas: one replica's ejection is seen by the others.

Each replica's :class:`~latgate.providers.ProviderPool` ejects an endpoint on its own
evidence (passive health: consecutive failures) and restores it on a success. A
:class:`HealthSync` task reconciles that with Redis once per ``interval_seconds``, off
the request path:

- an endpoint whose local health changed since the last sync publishes the change
  (ejected: a mark with a time to live; restored: the mark removed);
- otherwise the shared mark wins: present means ejected here too, absent means
  healthy. So a replica that never talked to a failing endpoint stops choosing it
  within one interval, and a success anywhere restores it everywhere.

The mark expires after ``ttl_seconds``: then every replica tries the endpoint again
(one replica ejects it again after its failures), so an endpoint that came back is
not kept out forever by a replica that stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from latgate.metrics import Metrics
from latgate.providers import EndpointState, ProviderPool
from latgate.state.base import StateUnavailable
from latgate.state.redis_store import RedisState

log = logging.getLogger("latgate.state")
SYNC_INTERVAL_SECONDS = 1.0
EJECTION_TTL_SECONDS = 30.0


class HealthSync:
    """Reconciles endpoint health between this replica's pool and Redis.

    Args:
        store: the shared Redis state.
        pool: this replica's providers.
        metrics: ``latgate_provider_healthy`` is updated when a shared mark changes
            an endpoint here.
        ttl_seconds: how long an ejection mark lives.
    """

    def __init__(
        self,
        *,
        store: RedisState,
        pool: ProviderPool,
        metrics: Metrics,
        ttl_seconds: float = EJECTION_TTL_SECONDS,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._ttl = ttl_seconds
        self._endpoints: dict[str, tuple[str, EndpointState]] = {
            f"{name}:{ep.config.id}": (name, ep) for name, runtime in pool.providers.items() for ep in runtime.endpoints
        }
        self._agreed: dict[str, bool] = {key: True for key in self._endpoints}

    async def sync_once(self) -> None:
        """One reconciliation (see the module docstring).

        Raises:
            StateUnavailable: Redis could not be read or written; nothing changed here.
        """
        keys = list(self._endpoints)
        ejected = await self._store.ejected_endpoints(keys)
        for key in keys:
            provider, endpoint = self._endpoints[key]
            local = endpoint.healthy
            if local != self._agreed[key]:
                await self._store.mark_endpoint(key, ejected=not local, ttl_seconds=self._ttl)
                self._agreed[key] = local
                continue
            shared = key not in ejected
            if shared != local:
                endpoint.healthy = shared
                endpoint.consecutive_failures = 0
                self._metrics.set_endpoint_health(provider=provider, endpoint=endpoint.config.id, healthy=shared)
            self._agreed[key] = shared


async def run_health_sync(
    current: Callable[[], HealthSync | None], *, interval_seconds: float = SYNC_INTERVAL_SECONDS
) -> None:
    """Sync the current gateway's health every ``interval_seconds``, until cancelled.

    ``current`` returns the :class:`HealthSync` of the gateway serving now (``None``
    without Redis), so a config reload that swaps the gateway is followed.
    """
    while True:
        sync = current()
        if sync is not None:
            with contextlib.suppress(StateUnavailable):
                await sync.sync_once()
        await asyncio.sleep(interval_seconds)
