"""The connector seam: how one provider's endpoints are addressed, probed and read for
load, and how their engine says it is full."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import orjson

from latgate.foundation.config.schema import EndpointConfig
from latgate.live.connectors.load import EngineLoad, parse_gauges, root_url


class Connector:
    """OpenAI-compatible adapter; subclasses override only what their engine differs in.

    Class attributes:
        name: the ``connector = "..."`` value that selects it.
        health_path: probed relative to the endpoint's versioned base URL
            (``GET {base_url}{health_path}``), a cheap request every engine answers;
            relative to the server root when ``health_at_root``.
        load_metrics_path: where the engine exports Prometheus load gauges, relative
            to the endpoint's *root* (``None`` when it exports none).
        running_metric / waiting_metric: the gauge names there for running and queued
            requests (vLLM: ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``).
        models_catalog: the engine's ``/models`` list is read for its context windows
            and model objects (:mod:`latgate.live.providers.catalog`).
        text_error: a marker the engine writes into a streamed content delta to report
            a failure (TileRT: ``[decode error: ``): such a delta is an error, never
            shown to the client as text.
        queues: the engine queues requests beyond its capacity (False: it refuses
            them at once, and latgate may hold a latency-sensitive request for a free
            slot, see :mod:`latgate.routing.admission`).
    """

    name: ClassVar[str] = "openai"
    health_path: ClassVar[str] = "/models"
    health_at_root: ClassVar[bool] = False
    load_metrics_path: ClassVar[str | None] = None
    running_metric: ClassVar[str | None] = None
    waiting_metric: ClassVar[str | None] = None
    models_catalog: ClassVar[bool] = False
    queues: ClassVar[bool] = True
    text_error: ClassVar[bytes | None] = None

    def url(self, endpoint: EndpointConfig, path: str) -> str:
        """Full upstream URL for an OpenAI path such as ``/chat/completions``."""
        return endpoint.base_url + path

    def health_url(self, endpoint: EndpointConfig) -> str:
        """The URL active probes ``GET``."""
        return (root_url(endpoint.base_url) if self.health_at_root else endpoint.base_url) + self.health_path

    def load_paths(self) -> tuple[str, ...]:
        """Paths under the server root read for load every ``load_interval_sec`` (none
        for a plain OpenAI-compatible server)."""
        return (self.load_metrics_path,) if self.load_metrics_path else ()

    def parse_load(self, pages: Mapping[str, str]) -> EngineLoad | None:
        """The load in the pages read (``{path: body text}``, the paths that answered
        200), or None when they say nothing. Here: the Prometheus gauges
        ``running_metric`` / ``waiting_metric``."""
        text = pages.get(self.load_metrics_path or "")
        if text is None:
            return None
        names = tuple(name for name in (self.running_metric, self.waiting_metric) if name)
        gauges = parse_gauges(text, names)
        running, waiting = gauges.get(self.running_metric or ""), gauges.get(self.waiting_metric or "")
        if running is None and waiting is None:
            return None
        return EngineLoad(
            running=None if running is None else int(running), waiting=None if waiting is None else int(waiting)
        )

    def busy(self, status: int, body: bytes) -> bool:
        """True when an answer before the first byte says the engine is full now, not
        failing (the request goes to the next candidate at once, nothing counted
        against the endpoint). No OpenAI-compatible server has such an answer."""
        return False


class VllmConnector(Connector):
    """vLLM's OpenAI server; load gauges at ``/metrics``."""

    name = "vllm"
    load_metrics_path = "/metrics"
    running_metric = "vllm:num_requests_running"
    waiting_metric = "vllm:num_requests_waiting"
    models_catalog = True


class SglangConnector(Connector):
    """SGLang's OpenAI server; load gauges at ``/metrics`` (``sglang:`` prefix)."""

    name = "sglang"
    load_metrics_path = "/metrics"
    running_metric = "sglang:num_running_reqs"
    waiting_metric = "sglang:num_queue_reqs"
    models_catalog = True


class TileRtConnector(Connector):
    """TileRT's prefill/decode router (``tilert/pd_vllm/pd_router.py``, tile-ai/TileRT).

    It serves ``/v1/chat/completions`` and ``/v1/completions`` and, at its root,
    ``GET /health`` (``{"status": "ok", "decode_free": N}``: decode nodes free now) and
    ``GET /pool_status`` (``{"nodes": [{"host": ..., "busy": ...}, ...]}``); no
    ``/v1/models`` and no ``/metrics``, so neither is ever asked for. Each decode node
    takes one request; with none free the router answers 429 ``{"error": "all decode
    nodes busy"}`` at once, without queueing.
    """

    name = "tile_rt_connector"
    health_path = "/health"
    health_at_root = True
    queues = False
    text_error = b"[decode error: "

    def load_paths(self) -> tuple[str, ...]:
        return ("/health", "/pool_status")

    def parse_load(self, pages: Mapping[str, str]) -> EngineLoad | None:
        """Capacity: the nodes of ``/pool_status``; running: capacity minus
        ``/health``'s ``decode_free`` (``/pool_status``'s busy flags without it)."""
        health, status = _json(pages.get("/health")), _json(pages.get("/pool_status"))
        nodes = status.get("nodes") if isinstance(status, dict) else None
        capacity = len(nodes) if isinstance(nodes, list) and nodes else None
        reported = health.get("decode_free") if isinstance(health, dict) else None
        free: int | None = None
        if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0:
            free = reported
        if free is None and capacity is not None and isinstance(nodes, list):  # capacity: nodes is a list
            free = sum(1 for node in nodes if isinstance(node, dict) and node.get("busy") is False)
        if free is None or capacity is None:
            return None if capacity is None else EngineLoad(capacity=capacity)
        return EngineLoad(running=max(0, capacity - free), waiting=0, capacity=capacity)

    def busy(self, status: int, body: bytes) -> bool:
        """A 429 whose string error says every decode node is busy."""
        if status != 429:
            return False
        error = _json(body.decode("utf-8", "replace"))
        error = error.get("error") if isinstance(error, dict) else None
        return isinstance(error, str) and "decode nodes busy" in error


def _json(text: str | None) -> object:
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


BUILTIN: dict[str, type[Connector]] = {
    cls.name: cls for cls in (Connector, VllmConnector, SglangConnector, TileRtConnector)
}
