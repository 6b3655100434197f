"""Background reads of every endpoint: active health probes and engine load gauges.

- Probes: ``GET`` of the connector's ``health_path`` (``/models`` under the versioned
  base URL by default) with the provider's key, every ``[health] probe_interval_sec``,
  starting one interval after start-up, and only of endpoints that answered no request
  during the last interval (live traffic is evidence enough, and costs nothing).
  Any answer below 500 is alive (a 404 or 401 says the server is up); a 5xx, a refused
  connection or no answer within ``probe_timeout_sec`` is a failed probe
  (:meth:`~latgate.providers.pool.ProviderPool.record_probe`: two in a row open the
  circuit, one good one closes a half-open circuit).
- Engine load: where the connector names Prometheus gauges (vLLM
  ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` at ``/metrics`` of the
  server root; SGLang ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs``), every
  ``load_interval_sec``; the TTFT prediction counts the requests the engine has beyond
  latgate's own; an endpoint whose circuit opened for errors and whose engine answers
  here again gets its trial request at once. An endpoint that answers 404 there is not asked again. A failed read
  changes nothing (the numbers go stale and are ignored after a few seconds).
- Model lists: where the connector sets ``models_catalog`` (vLLM, SGLang), ``GET
  {base_url}/models`` at start-up and every ``CATALOG_INTERVAL_SECONDS``, kept as the
  endpoint's ``catalog`` (context windows, the engine's model objects:
  :mod:`latgate.providers.catalog`). A failed read keeps the last list.

:func:`run_monitor` runs both loops until cancelled (the app's lifespan starts and
cancels it); each round reads the current pool, so a config reload is followed.
Tests call :meth:`Monitor.probe_once` / :meth:`Monitor.read_load_once` directly.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable

from latgate.providers.catalog import CATALOG_INTERVAL_SECONDS, parse_catalog
from latgate.providers.pool import ProviderPool, ProviderRuntime
from latgate.providers.state import EndpointState
from latgate.proxy.upstream import UpstreamClient, UpstreamFailure

log = logging.getLogger("latgate")
_VERSION_SUFFIX = re.compile(r"/v\d+(?:beta\d*|alpha\d*)?$")
DISABLED_RECHECK_SECONDS = 5.0
"""A loop turned off by its interval (0) looks again this often (a reload may turn it on)."""


def parse_gauges(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum each named metric's samples in Prometheus text exposition format.

    Lines are ``name{labels} value [timestamp]`` or ``name value``; comments and other
    metrics are skipped, as are unparsable values. Names never seen are absent.

    Example::

        parse_gauges('vllm:num_requests_running{model_name="m"} 3.0\\n', ("vllm:num_requests_running",))
        # {'vllm:num_requests_running': 3.0}
    """
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        for name in names:
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
                rest = line[len(name) :]
                if rest[0] == "{":
                    rest = rest[rest.rfind("}") + 1 :]
                parts = rest.split()
                try:
                    value = float(parts[0])
                except (IndexError, ValueError):
                    break
                totals[name] = totals.get(name, 0.0) + value
                break
    return totals


def root_url(base_url: str) -> str:
    """The server root of a versioned base URL (``http://h:1/v1`` -> ``http://h:1``)."""
    return _VERSION_SUFFIX.sub("", base_url)


class Monitor:
    """Probes and load reads for one pool.

    Args:
        pool: the providers whose endpoints are read.
        client: the upstream client (its ``get``).
    """

    def __init__(self, *, pool: ProviderPool, client: UpstreamClient) -> None:
        self.pool = pool
        self.client = client
        self._no_gauges: set[str] = set()

    def _endpoints(self) -> list[tuple[ProviderRuntime, EndpointState]]:
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
        """Read every engine's load gauges once, concurrently (connectors that have them)."""
        await asyncio.gather(
            *(
                self._read_load(runtime, ep)
                for runtime, ep in self._endpoints()
                if runtime.connector.load_metrics_path and ep.key not in self._no_gauges
            )
        )

    async def read_catalogs_once(self) -> None:
        """Read every engine's model list once, concurrently (connectors that have one)."""
        await asyncio.gather(
            *(self._read_catalog(runtime, ep) for runtime, ep in self._endpoints() if runtime.connector.models_catalog)
        )

    async def _read_catalog(self, runtime: ProviderRuntime, endpoint: EndpointState) -> None:
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

    async def _probe(self, runtime: ProviderRuntime, endpoint: EndpointState) -> None:
        url = runtime.connector.url(endpoint.config, runtime.connector.health_path)
        timeout = self.pool.config.health.probe_timeout_sec
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                response = await self.client.get(
                    url=url, headers=runtime.auth_headers, timeout_seconds=timeout, egress=runtime.egress
                )
            ok = response.status_code < 500
        except UpstreamFailure as failure:
            if failure.kind == "local":  # latgate had no descriptor: says nothing of the endpoint
                return
            ok = False
        except TimeoutError:
            ok = False
        self.pool.record_probe(runtime, endpoint, ok=ok, ms=(time.perf_counter() - started) * 1000.0)

    async def _read_load(self, runtime: ProviderRuntime, endpoint: EndpointState) -> None:
        connector = runtime.connector
        url = root_url(endpoint.config.base_url) + (connector.load_metrics_path or "")
        names = tuple(name for name in (connector.running_metric, connector.waiting_metric) if name)
        timeout = self.pool.config.health.probe_timeout_sec
        try:
            async with asyncio.timeout(timeout):
                response = await self.client.get(
                    url=url, headers=runtime.auth_headers, timeout_seconds=timeout, egress=runtime.egress
                )
        except (UpstreamFailure, TimeoutError):
            return
        if response.status_code == 404:
            self._no_gauges.add(endpoint.key)
            log.info("endpoint %s exports no load gauges: not read again", endpoint.config.id)
            return
        if response.status_code != 200:
            return
        gauges = parse_gauges(response.text, names)
        running, waiting = (
            gauges.get(connector.running_metric or ""),
            gauges.get(connector.waiting_metric or ""),
        )
        if running is None and waiting is None:
            return
        self.pool.record_engine_load(
            runtime,
            endpoint,
            running=None if running is None else int(running),
            waiting=None if waiting is None else int(waiting),
        )


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
