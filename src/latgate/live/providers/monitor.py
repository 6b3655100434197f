"""Background reads of every endpoint: active health probes and engine load gauges.

- Probes: ``GET`` of the connector's health URL (``/models`` under the versioned
  base URL by default, TileRT's ``/health`` at the server root) with the provider's key, every ``[health] probe_interval_sec``,
  starting one interval after start-up, and only of endpoints that answered no request
  during the last interval (live traffic is evidence enough, and costs nothing).
  Any answer below 500 is alive (a 404 or 401 says the server is up); a 5xx, a refused
  connection or no answer within ``probe_timeout_sec`` is a failed probe
  (:meth:`~latgate.live.providers.pool.ProviderPool.record_probe`: two in a row open the
  circuit, one good one closes a half-open circuit).
- Engine load: the connector's load pages under the server root, every
  ``load_interval_sec`` (vLLM ``vllm:num_requests_running`` /
  ``vllm:num_requests_waiting`` at ``/metrics``; SGLang ``sglang:num_running_reqs`` /
  ``sglang:num_queue_reqs``; TileRT ``/health``'s ``decode_free`` and
  ``/pool_status``'s node count, which becomes the endpoint's capacity); the TTFT
  prediction counts the requests the engine has beyond latgate's own; an endpoint
  whose circuit opened for errors and whose engine answers here again gets its trial
  request at once. A page that answers 404 is not asked for again. A failed read
  changes nothing (the numbers go stale and are ignored after a few seconds).
  The same ``/metrics`` page gives the engine's prefix-cache facts (vLLM, SGLang:
  :mod:`latgate.live.providers.engine_cache`), kept as the endpoint's ``engine_cache``.
- Model lists: where the connector sets ``models_catalog`` (vLLM, SGLang), ``GET
  {base_url}/models`` at start-up and every ``CATALOG_INTERVAL_SECONDS``, kept as the
  endpoint's ``catalog`` (context windows, the engine's model objects:
  :mod:`latgate.live.providers.catalog`). A failed read keeps the last list.

:func:`run_monitor` runs both loops until cancelled (the app's lifespan starts and
cancels it); each round reads the current pool, so a config reload is followed.
Tests call :meth:`Monitor.probe_once` / :meth:`Monitor.read_load_once` directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from latgate.live.connectors.load import parse_gauges, root_url
from latgate.live.providers.catalog import CATALOG_INTERVAL_SECONDS, parse_catalog
from latgate.live.providers.endpoint import EndpointRuntime
from latgate.live.providers.engine_cache import parse_engine_cache
from latgate.live.providers.pool import ProviderPool
from latgate.live.providers.runtime import ProviderRuntime
from latgate.transport.upstream import UpstreamClient, UpstreamFailure

__all__ = ["Monitor", "parse_gauges", "root_url", "run_monitor"]  # parse_gauges: also read by benchmarks
log = logging.getLogger("latgate")
DISABLED_RECHECK_SECONDS = 5.0
"""A loop turned off by its interval (0) looks again this often (a reload may turn it on)."""


class Monitor:
    """Probes and load reads for one pool.

    Args:
        pool: the providers whose endpoints are read.
        client: the upstream client (its ``get``).
    """

    def __init__(self, *, pool: ProviderPool, client: UpstreamClient) -> None:
        self.pool = pool
        self.client = client
        self._no_gauges: set[tuple[str, str]] = set()  # (endpoint key, load path) that answered 404

    def _endpoints(self) -> list[tuple[ProviderRuntime, EndpointRuntime]]:
        return [(runtime, ep) for runtime in self.pool.providers.values() for ep in runtime.endpoints]

    async def probe_once(self) -> None:
        """Probe, concurrently, every endpoint that answered no request in the last
        probe interval."""
        recent = self.pool.clock() - self.pool.config.health.probe_interval_sec
        await asyncio.gather(
            *(
                self._probe(runtime, ep)
                for runtime, ep in self._endpoints()
                if ep.answered_at is None or ep.answered_at < recent
            )
        )

    async def probe_provider(self, runtime: ProviderRuntime) -> None:
        """Probe every endpoint of one provider now, concurrently (``/readyz`` before the
        default route has answered anything)."""
        await asyncio.gather(*(self._probe(runtime, ep) for ep in runtime.endpoints))

    async def read_load_once(self) -> None:
        """Read every engine's load once, concurrently (connectors that have load pages)."""
        await asyncio.gather(
            *(self._read_load(runtime, ep) for runtime, ep in self._endpoints() if runtime.connector.load_paths())
        )

    async def read_catalogs_once(self) -> None:
        """Read every engine's model list once, concurrently (connectors that have one)."""
        await asyncio.gather(
            *(self._read_catalog(runtime, ep) for runtime, ep in self._endpoints() if runtime.connector.models_catalog)
        )

    async def _read_catalog(self, runtime: ProviderRuntime, endpoint: EndpointRuntime) -> None:
        url = runtime.connector.url(endpoint.config, "/models")
        timeout = self.pool.config.health.probe_timeout_sec or 2.0
        try:
            async with asyncio.timeout(timeout):
                response = await self.client.get(
                    url=url, headers=runtime.auth_headers, timeout_seconds=timeout, egress=runtime.egress
                )
        except (UpstreamFailure, TimeoutError):
            return
        if response.status_code == 200:
            catalog = parse_catalog(response.content)
            if catalog is not None:
                endpoint.catalog = catalog

    async def _probe(self, runtime: ProviderRuntime, endpoint: EndpointRuntime) -> None:
        url = runtime.connector.health_url(endpoint.config)
        timeout = self.pool.config.health.probe_timeout_sec
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                response = await self.client.get(
                    url=url, headers=runtime.auth_headers, timeout_seconds=timeout, egress=runtime.egress
                )
            ok = response.status_code < 500
            cause = None if ok else f"HTTP {response.status_code}"
        except UpstreamFailure as failure:
            if failure.kind == "local":  # latgate had no descriptor: says nothing of the endpoint
                return
            ok, cause = False, str(failure)  # the cause, never the URL (UpstreamFailure)
        except TimeoutError:
            ok, cause = False, f"no answer within probe_timeout_sec ({timeout:g} s)"
        ms = (time.perf_counter() - started) * 1000.0
        self.pool.record_probe(runtime, endpoint, ok=ok, ms=ms, cause=cause)

    async def _read_load(self, runtime: ProviderRuntime, endpoint: EndpointRuntime) -> None:
        connector = runtime.connector
        paths = [path for path in connector.load_paths() if (endpoint.key, path) not in self._no_gauges]
        if not paths:
            return
        root = root_url(endpoint.config.base_url)
        pages = await asyncio.gather(*(self._page(runtime, endpoint, root, path) for path in paths))
        read = {path: text for path, text in zip(paths, pages, strict=True) if text is not None}
        load = connector.parse_load(read)
        if connector.load_metrics_path is not None:
            cache = parse_engine_cache(connector.name, read.get(connector.load_metrics_path))
            if cache is not None:
                self.pool.record_engine_cache(runtime, endpoint, cache)
        if load is not None:
            self.pool.record_engine_load(runtime, endpoint, running=load.running, waiting=load.waiting, capacity=load.capacity)

    async def _page(self, runtime: ProviderRuntime, endpoint: EndpointRuntime, root: str, path: str) -> str | None:
        """One load page's text; None when it did not answer 200 (a 404: never asked again)."""
        timeout = self.pool.config.health.probe_timeout_sec
        try:
            async with asyncio.timeout(timeout):
                response = await self.client.get(
                    url=root + path, headers=runtime.auth_headers, timeout_seconds=timeout, egress=runtime.egress
                )
        except (UpstreamFailure, TimeoutError):
            return None
        if response.status_code == 404:
            self._no_gauges.add((endpoint.key, path))
            log.info("endpoint %s does not serve %s: not read again", endpoint.config.id, path)
            return None
        return response.text if response.status_code == 200 else None


async def run_monitor(
    current: Callable[[], tuple[ProviderPool, UpstreamClient]],
    *,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Probe and read load forever (until cancelled), following ``current()`` (the pool
    and client of the config in force) from one round to the next."""
    last: list[Monitor] = []

    def monitor() -> Monitor:
        pool, client = current()
        if not last or last[0].pool is not pool or last[0].client is not client:
            last[:] = [Monitor(pool=pool, client=client)]
        return last[0]

    async def loop(
        interval: Callable[[Monitor], float], once: Callable[[Monitor], Awaitable[None]], *, wait_first: bool
    ) -> None:
        if wait_first:
            await sleep(interval(monitor()) or DISABLED_RECHECK_SECONDS)
        while True:
            current_monitor = monitor()
            seconds = interval(current_monitor)
            if seconds > 0:
                try:
                    await once(current_monitor)
                except Exception as exc:  # noqa: BLE001 (a bug here must not stop health checking)
                    log.error("endpoint monitor failed: %s: %s", type(exc).__name__, exc)
            await sleep(seconds if seconds > 0 else DISABLED_RECHECK_SECONDS)

    await asyncio.gather(
        loop(lambda m: m.pool.config.health.probe_interval_sec, Monitor.probe_once, wait_first=True),
        loop(lambda m: m.pool.config.health.load_interval_sec, Monitor.read_load_once, wait_first=False),
        loop(lambda m: CATALOG_INTERVAL_SECONDS, Monitor.read_catalogs_once, wait_first=False),
    )
