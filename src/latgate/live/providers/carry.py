"""What a config reload keeps of the providers' live state (docs/deploy.md, "What a
reload keeps").

A reload builds a new :class:`~latgate.live.providers.pool.ProviderPool`; before anything
else sees it, :func:`carry_live_state` moves into it the live state of the pool it
replaces, for every endpoint whose identity is unchanged: its provider keeps its name,
connector, engine and role (:func:`same_engine`), the endpoint its URL
(``base_url``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from latgate.foundation.config.schema import ProviderConfig
from latgate.foundation.metrics import Metrics
from latgate.live.providers.health import CircuitRecord

if TYPE_CHECKING:
    from latgate.live.providers.endpoint import EndpointRuntime
    from latgate.live.providers.pool import ProviderPool
    from latgate.live.providers.runtime import ProviderRuntime


def same_engine(before: ProviderConfig, after: ProviderConfig) -> bool:
    """Whether live numbers measured under ``before`` still describe a provider
    configured as ``after``: the same connector, engine and role (the role seeds the
    TTFT and ITL priors; the connector and engine decide what is measured and how)."""
    return (before.connector, before.engine, before.role) == (after.connector, after.engine, after.role)


def carry_live_state(pool: ProviderPool, previous: ProviderPool, *, metrics: Metrics) -> list[str]:
    """Carry ``previous``'s live state into ``pool`` (just built for a reloaded
    config); returns the keys (``PROVIDER:ENDPOINT_ID``) of the endpoints carried.
    ``metrics``: where the carried endpoints' health is exported.

    A carried endpoint's :class:`EndpointRuntime` itself moves into ``pool``
    (:meth:`EndpointRuntime.rebind` gives it the new config, key and breaker), so every
    number it holds is kept (TTFT and ITL fits, counters, engine gauges, probes,
    catalog; state added to it later joins with no line here), and requests of the old
    config still in flight end on the same object: in-flight counts settle against
    what is carried, never below 0. Its circuit record (open with its time left,
    failures counted, back-off) is shared by both pools' circuit stores, so an old
    request's outcome counts too, and a slot an old request frees reaches ``pool``'s
    admission. Per provider: :meth:`ProviderRuntime.carry_from`. Pool-wide: the
    recent completion lengths. The gateway queue's own state (outcome counters, the
    learnt wait correction and leases) is carried by
    :meth:`~latgate.routing.admission.Admission.carry_from`. Every other endpoint starts afresh.
    """
    pool.completion_lengths = previous.completion_lengths
    records: dict[str, CircuitRecord] = {}
    carried: list[str] = []
    for name, runtime in pool.providers.items():
        before = previous.providers.get(name)
        if before is None or not same_engine(before.config, runtime.config):
            continue
        runtime.carry_from(before)
        by_url = {ep.config.base_url: ep for ep in before.endpoints}
        for index, fresh in enumerate(runtime.endpoints):
            old = by_url.pop(fresh.config.base_url, None)
            if old is None:
                continue
            records[fresh.key] = previous.breaker.store.get(old.key)
            old.rebind(fresh, before=before.config, after=runtime.config)
            runtime.endpoints[index] = old
            carried.append(fresh.key)
    for key, record in records.items():  # both stores: an old request's outcome lands here too
        pool.breaker.store.put(key, record)
        previous.breaker.store.put(key, record)
    for runtime in pool.providers.values():
        for endpoint in runtime.endpoints:
            if endpoint.key in records:
                metrics.set_endpoint_health(provider=runtime.name, endpoint=endpoint.config.id, healthy=endpoint.healthy)
    freed_before = previous.slot_freed

    def freed(runtime: ProviderRuntime, endpoint: EndpointRuntime, seconds: float | None) -> None:
        # an old request ending frees a slot of a carried endpoint: the new pool's waiters too
        if freed_before is not None:
            freed_before(runtime, endpoint, seconds)
        current = pool.providers.get(runtime.name)
        if pool.slot_freed is not None and current is not None and endpoint in current.endpoints:
            pool.slot_freed(current, endpoint, seconds)

    previous.slot_freed = freed
    return carried
