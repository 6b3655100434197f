"""Provider health shared by replicas: one replica's ejection is seen by the others.

Each replica's :class:`~latgate.live.providers.ProviderPool` opens an endpoint's circuit on
its own evidence (failures, probes, latency; see :mod:`latgate.live.providers.health`) and
closes it on a success. A :class:`HealthSync` reconciles that with Redis once a second,
off the request path, through ``EndpointRuntime.healthy`` (setting it ejects with reason
``shared`` or restores):

- an endpoint whose local health changed since the last sync publishes the change
  (ejected: a mark with a time to live; restored: the mark removed);
- a mark this replica published is refreshed while the endpoint stays unhealthy here;
- otherwise the shared mark wins: present means ejected here too, absent means
  healthy. So a replica that never talked to a failing endpoint stops choosing it
  within about a second, and a success anywhere restores it everywhere.

A mark outlives its publisher by at most ``ttl_seconds``: a replica that stopped
cannot keep an endpoint out forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from latgate.foundation.metrics import Metrics
from latgate.live.store.base import StoreUnavailable
from latgate.live.store.redis_store import RedisStore

if TYPE_CHECKING:  # live/providers/pool.py imports latgate.live.store (its package runs this module)
    from latgate.live.providers import EndpointRuntime, ProviderPool

log = logging.getLogger("latgate.store")
SYNC_INTERVAL_SECONDS = 1.0
EJECTION_TTL_SECONDS = 30.0


class HealthSync:
    """Reconciles endpoint health between this replica's pool and Redis.

    Args:
        store: the shared Redis store.
        pool: this replica's providers.
        metrics: ``latgate_provider_healthy`` is updated when a shared mark changes
            an endpoint here.
        ttl_seconds: how long an ejection mark lives.
    """

    def __init__(
        self,
        *,
        store: RedisStore,
        pool: ProviderPool,
        metrics: Metrics,
        ttl_seconds: float = EJECTION_TTL_SECONDS,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._ttl = ttl_seconds
        self._endpoints: dict[str, tuple[str, EndpointRuntime]] = {
            f"{name}:{ep.config.id}": (name, ep)
            for name, runtime in pool.providers.items()
            for ep in runtime.endpoints
        }
        self._agreed: dict[str, bool] = {key: True for key in self._endpoints}
        self._published: set[str] = set()

    async def sync_once(self) -> None:
        """One reconciliation (see the module docstring).

        Raises:
            StoreUnavailable: Redis could not be read or written; nothing changed here.
        """
        keys = list(self._endpoints)
        ejected = await self._store.ejected_endpoints(keys)
        for key in keys:
            provider, endpoint = self._endpoints[key]
            local = endpoint.healthy
            if local != self._agreed[key]:  # changed here: publish
                await self._store.mark_endpoint(key, ejected=not local, ttl_seconds=self._ttl)
                self._agreed[key] = local
                if local:
                    self._published.discard(key)
                else:
                    self._published.add(key)
                continue
            shared = key not in ejected
            if not shared and key in self._published:  # our mark: keep it alive
                await self._store.mark_endpoint(key, ejected=True, ttl_seconds=self._ttl)
                continue
            if shared != local:  # another replica's verdict
                endpoint.healthy = shared
                self._metrics.set_endpoint_health(
                    provider=provider, endpoint=endpoint.config.id, healthy=shared
                )
            if shared:
                self._published.discard(key)
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
            with contextlib.suppress(StoreUnavailable):
                await sync.sync_once()
        await asyncio.sleep(interval_seconds)
