"""The connector seam: how one provider's endpoints are addressed and probed."""

from __future__ import annotations

from typing import ClassVar

from latgate.config.schema import EndpointConfig


class Connector:
    """OpenAI-compatible adapter; subclasses override only what their engine differs in.

    Class attributes:
        name: the ``connector = "..."`` value that selects it.
        health_path: probed relative to the endpoint's versioned base URL
            (``GET {base_url}{health_path}``), a cheap request every engine answers.
        load_metrics_path: where the engine exports Prometheus load gauges, relative
            to the endpoint's *root* (``None`` when it exports none).
        running_metric / waiting_metric: the gauge names there for running and queued
            requests (vLLM: ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``).
        models_catalog: the engine's ``/models`` list is read for its context windows
            and model objects (:mod:`latgate.providers.catalog`).
    """

    name: ClassVar[str] = "openai"
    health_path: ClassVar[str] = "/models"
    load_metrics_path: ClassVar[str | None] = None
    running_metric: ClassVar[str | None] = None
    waiting_metric: ClassVar[str | None] = None
    models_catalog: ClassVar[bool] = False

    def url(self, endpoint: EndpointConfig, path: str) -> str:
        """Full upstream URL for an OpenAI path such as ``/chat/completions``."""
        return endpoint.base_url + path


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
    """A TileRT-style low-latency decode pool served behind an OpenAI-compatible API."""

    name = "tile_rt_connector"
    load_metrics_path = "/metrics"
    running_metric = "vllm:num_requests_running"
    waiting_metric = "vllm:num_requests_waiting"


BUILTIN: dict[str, type[Connector]] = {
    cls.name: cls for cls in (Connector, VllmConnector, SglangConnector, TileRtConnector)
}
