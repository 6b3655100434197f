"""Every Prometheus metric latgate exports, behind typed ``record_*`` methods.

Names, types and labels are those of docs/metrics.md's table. Label values come only from
configured sets: provider names, endpoint ids and configured model names (any other
model is ``other``), so cardinality is bounded whatever clients send. Call sites never
spell a label: they call :class:`Metrics` methods, which cache the labelled children
(``labels()`` costs about a microsecond; the cache makes the per-chunk path a dict hit).

Histogram buckets follow vLLM's TTFT / time-per-output-token / e2e buckets, extended
downwards because a low-latency decode pool answers in single milliseconds.

With ``latgate serve --workers N`` each worker process records into prometheus-client's
multiprocess files (``$PROMETHEUS_MULTIPROC_DIR``, set by the supervisor before the
workers start) and ``GET /metrics`` on any worker aggregates every worker's files
(:meth:`Metrics.render`). Gauges say how: in-flight requests are summed over live
workers, endpoint health is the minimum over live workers (an endpoint any worker finds
failing reads 0). A single process keeps the in-memory registry: no file I/O per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase

from latgate.foundation.decode_rate import decode_tokens_per_second
from latgate.foundation.histogram_batch import BATCH_SAMPLES, HistogramBatch  # noqa: F401  (BATCH_SAMPLES: re-exported, how far a scrape may lag a stream)

TTFT_BUCKETS_SECONDS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)
ITL_BUCKETS_SECONDS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 80.0,
)
E2E_BUCKETS_SECONDS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
TOKENS_PER_SECOND_BUCKETS = (
    1, 5, 10, 20, 30, 40, 50, 75, 100, 150, 200, 300, 400, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000,
)
QUEUE_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OVERHEAD_BUCKETS_SECONDS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
    0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)

OTHER_MODEL = "other"
_Metric = TypeVar("_Metric", bound=MetricWrapperBase)

OUTCOMES = ("ok", "client_gone", "upstream_error", "gateway_error")
"""Values of the ``outcome`` label of the token counters and the e2e and tokens/s
histograms: how a request that got an answer (or part of one) ended. ``ok``: answered
(2xx); ``client_gone``: the client left before the end (status 499); ``upstream_error``:
the upstream failed after output began (502, 504); ``gateway_error``: latgate ended it
(the drain deadline's 503, a 500)."""


def request_outcome(status: int) -> str:
    """The ``outcome`` label of a request that ended with HTTP ``status`` (see :data:`OUTCOMES`)."""
    if 200 <= status < 300:
        return "ok"
    if status == 499:
        return "client_gone"
    if status in (502, 504):
        return "upstream_error"
    return "gateway_error"

# No ``*_created`` series (a start timestamp per counter and histogram child): Prometheus
# does not need them and they doubled /metrics. Process-wide, before any metric exists.
disable_created_metrics()


class Metrics:
    """The gateway's metrics in their own registry (one per app; no global state).

    Args:
        providers: configured provider names (label values of ``provider``).
        models: configured public and served model names; others are reported as
            ``other``.
        registry: where to register; a fresh :class:`CollectorRegistry` by default.
        multiprocess_dir: prometheus-client's multiprocess directory when this process is
            one of several workers (``/metrics`` then aggregates all workers' files);
            ``None`` for a single process. The directory must also be in
            ``$PROMETHEUS_MULTIPROC_DIR`` before ``prometheus_client`` is imported.
    """

    def __init__(
        self,
        *,
        providers: Iterable[str],
        models: Iterable[str],
        registry: CollectorRegistry | None = None,
        multiprocess_dir: str | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.multiprocess_dir = multiprocess_dir
        self._providers = frozenset(providers)
        self._models = frozenset(models)
        r = self.registry
        pm = ("provider", "model")
        pmo = ("provider", "model", "outcome")
        self.requests = Counter("latgate_requests", "Requests answered, by final provider, model and HTTP status code", ("provider", "model", "code"), registry=r)
        self.route_decisions = Counter("latgate_route_decisions", "Routed requests by the provider that answered (or was tried last) and its route reason, as X-Latgate-Provider and X-Latgate-Route-Reason say", ("provider", "reason"), registry=r)
        self.ttft = Histogram("latgate_time_to_first_token_seconds", "Gateway receipt of the request to the first generated-content chunk written to the client", pm, buckets=TTFT_BUCKETS_SECONDS, registry=r)
        self.itl = Histogram("latgate_inter_token_latency_seconds", "Time between output tokens written to the client: each gap between content chunks divided among the tokens they carried (from usage)", pm, buckets=ITL_BUCKETS_SECONDS, registry=r)
        self.e2e = Histogram("latgate_e2e_request_latency_seconds", "Gateway receipt of the request to the last byte written, by outcome (ok, client_gone, upstream_error, gateway_error)", pmo, buckets=E2E_BUCKETS_SECONDS, registry=r)
        self.tokens_per_second = Histogram("latgate_output_tokens_per_second", "Completion tokens / (last token time - first token time), as a client measures it, the span floored at 0.5 ms per token (bursts), by outcome", pmo, buckets=TOKENS_PER_SECOND_BUCKETS, registry=r)
        self.prompt_tokens = Counter("latgate_prompt_tokens", "Prompt tokens (upstream usage when reported, else latgate's estimate) of requests answered or partly answered, by outcome", pmo, registry=r)
        self.completion_tokens = Counter("latgate_completion_tokens", "Completion tokens (upstream usage when reported, else counted chunks), streamed ones of a request that did not end ok included, by outcome", pmo, registry=r)
        self.in_flight = Gauge("latgate_in_flight_requests", "Requests being served, by provider", ("provider",), multiprocess_mode="livesum", registry=r)
        self.upstream_errors = Counter("latgate_upstream_errors", "Upstream failures by provider and kind", ("provider", "kind"), registry=r)
        self.retries = Counter("latgate_retries", "Retries of a request on the same provider", ("provider",), registry=r)
        self.fallbacks = Counter("latgate_fallbacks", "Requests moved to the next provider before the first byte", ("from", "to"), registry=r)
        self.pool_in_use = Gauge("latgate_upstream_pool_in_use", "Upstream connections in use (busy, not idle) in latgate's pool, by provider; at the provider's max_connections new requests wait, then get 503", ("provider",), multiprocess_mode="livesum", registry=r)
        self.provider_healthy = Gauge("latgate_provider_healthy", "1 when the endpoint can take traffic", ("provider", "endpoint"), multiprocess_mode="livemin", registry=r)
        self.ejections = Counter("latgate_ejections", "Endpoints ejected (circuit opened), by reason: errors, probes, latency, shared", ("provider", "endpoint", "reason"), registry=r)
        self.overflows = Counter("latgate_overflows", "Requests sent past their preferred provider, predicted to miss their time-to-first-token budget", ("from", "to"), registry=r)
        self.hedges = Counter("latgate_hedges", "Hedged requests: a second copy sent because the first token was late, by the copy's provider", ("provider",), registry=r)
        self.hedge_wins = Counter("latgate_hedge_wins", "Hedged requests answered first by the copy (the original was cancelled)", ("provider",), registry=r)
        self.provider_info = Gauge("latgate_provider_info", "1 per configured provider, labelled with its role, connector and engine (empty when unset): dashboards join on it instead of naming providers", ("provider", "role", "connector", "engine"), multiprocess_mode="livemax", registry=r)
        # queue (issue 22): the gateway queue of every pool with a known capacity, and the retry/hedge budgets
        self.queue_wait = Histogram("latgate_queue_wait_seconds", "Time a request found its pool full and waited in the gateway queue (0: decided at once), by provider, priority class and outcome (admitted, late, overflow, shed, preempted)", ("provider", "priority", "outcome"), buckets=QUEUE_BUCKETS_SECONDS, registry=r)
        self.queue_depth = Gauge("latgate_queue_depth", "Requests waiting in the gateway queue now, by provider and priority class", ("provider", "priority"), multiprocess_mode="livesum", registry=r)
        self.budget_denied = Counter("latgate_retry_budget_exceeded", "Retries and hedges not sent: over the provider's retry budget, or (hedge_slow) most of its endpoints at capacity at once", ("provider", "kind"), registry=r)
        self.overhead = Histogram("latgate_gateway_overhead_seconds", "Time latgate itself spent on a request before sending it upstream", buckets=OVERHEAD_BUCKETS_SECONDS, registry=r)
        # sessions (issue 21): cached prompt tokens, as latgate's prefix index predicted
        # them at the first token and as the engine reported them in its usage
        self.prompt_tokens_cached = Counter("latgate_prompt_tokens_cached", "Prompt tokens served from the engine's prefix cache, by provider and source: predicted (latgate's prefix index, at the first token) or reported (the engine's usage.prompt_tokens_details.cached_tokens)", ("provider", "source"), registry=r)
        # (id of the metric, its label values) -> that metric's child: a Counter's,
        # Gauge's or Histogram's, as _child returns it
        self._children: dict[tuple[int, *tuple[str, ...]], Any] = {}
        self._info_labels: set[tuple[str, str, str, str]] = set()

    def model_label(self, model: str | None) -> str:
        """``model`` if configured, else ``other`` (keeps label cardinality bounded)."""
        return model if model in self._models else OTHER_MODEL

    def _child(self, metric: _Metric, *labels: str) -> _Metric:
        key: tuple[int, *tuple[str, ...]] = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*labels)
            self._children[key] = child
        return child

    # typed recorders -----------------------------------------------------------------

    def record_cached_prompt_tokens(self, *, provider: str, tokens: int, source: str) -> None:
        """Prompt tokens served from a prefix cache, ``source`` ``predicted`` or ``reported``."""
        if tokens > 0:
            self._child(self.prompt_tokens_cached, provider, source).inc(tokens)

    def record_route(self, *, provider: str, reason: str) -> None:
        """A routed request at its end: the provider that answered it (or was tried
        last) and that attempt's route reason, the values of its ``X-Latgate-Provider``
        and ``X-Latgate-Route-Reason`` headers (``fallback:FROM``...: suffixes are
        configured provider and policy names, so cardinality stays bounded)."""
        self._child(self.route_decisions, provider, reason).inc()

    def record_request(self, *, provider: str, model: str, code: int | str) -> None:
        self._child(self.requests, provider, self.model_label(model), str(code)).inc()

    def record_ttft(self, *, provider: str, model: str, seconds: float) -> None:
        self._child(self.ttft, provider, self.model_label(model)).observe(seconds)

    def itl_observer(self, *, provider: str, model: str) -> Callable[[float], None]:
        """The histogram child's ``observe`` for one stream's inter-token gaps (seconds)."""
        return self._child(self.itl, provider, self.model_label(model)).observe

    def itl_batch(self, *, provider: str, model: str) -> HistogramBatch:
        """One stream's inter-token gaps (seconds), added to the histogram in batches
        (see :class:`HistogramBatch`; the caller flushes at the stream's end)."""
        return HistogramBatch(self._child(self.itl, provider, self.model_label(model)))

    def record_completion(
        self,
        *,
        provider: str,
        model: str,
        e2e_seconds: float,
        prompt_tokens: int,
        completion_tokens: int,
        decode_seconds: float | None,
        outcome: str = "ok",
    ) -> None:
        """End of a request that got an answer or part of one: e2e latency, token
        counters, tokens/s, under ``outcome`` (one of :data:`OUTCOMES`)."""
        label = self.model_label(model)
        self._child(self.e2e, provider, label, outcome).observe(e2e_seconds)
        if prompt_tokens:
            self._child(self.prompt_tokens, provider, label, outcome).inc(prompt_tokens)
        if completion_tokens:
            self._child(self.completion_tokens, provider, label, outcome).inc(completion_tokens)
        rate = decode_tokens_per_second(completion_tokens, decode_seconds)
        if rate is not None:
            self._child(self.tokens_per_second, provider, label, outcome).observe(rate)

    def in_flight_gauge(self, provider: str) -> Gauge:
        return self._child(self.in_flight, provider)

    def set_pool_in_use(self, in_use: dict[str, int]) -> None:
        """Busy upstream connections per configured provider (others are not labels)."""
        for provider in self._providers:
            self._child(self.pool_in_use, provider).set(in_use.get(provider, 0))

    def record_upstream_error(self, *, provider: str, kind: str) -> None:
        """``kind``: connect, timeout, status_4xx, status_429, status_5xx, stream_error, ..."""
        self._child(self.upstream_errors, provider, kind).inc()

    def record_retry(self, *, provider: str) -> None:
        self._child(self.retries, provider).inc()

    def record_fallback(self, *, from_provider: str, to_provider: str) -> None:
        self._child(self.fallbacks, from_provider, to_provider).inc()

    def record_ejection(self, *, provider: str, endpoint: str, reason: str) -> None:
        """An endpoint's circuit opened (``reason``: errors, probes, latency, shared)."""
        self._child(self.ejections, provider, endpoint, reason).inc()

    def record_overflow(self, *, from_provider: str, to_provider: str) -> None:
        self._child(self.overflows, from_provider, to_provider).inc()

    # queue (issue 22) ------------------------------------------------------------------

    def record_queue_wait(self, *, provider: str, priority: str, outcome: str, seconds: float) -> None:
        """A request that found ``provider`` full: how long it waited (0 when decided at
        once) and how it ended (``admitted``, ``late``: admitted after its budget with nowhere
        else to go, ``overflow``, ``shed``, ``preempted``)."""
        self._child(self.queue_wait, provider, priority, outcome).observe(seconds)

    def start_queue_series(self, provider: str, classes: tuple[str, ...]) -> None:
        """Export ``provider``'s queue depth per class at 0 from the start, and its
        admitted waits' histogram, so dashboards and ``rate()`` see the first wait."""
        for priority in classes:
            self._child(self.queue_depth, provider, priority)
            self._child(self.queue_wait, provider, priority, "admitted")

    def queue_depth_gauge(self, provider: str, priority: str) -> Gauge:
        """The gauge of requests of class ``priority`` waiting for ``provider``."""
        return self._child(self.queue_depth, provider, priority)

    def record_budget_denied(self, *, provider: str, kind: str) -> None:
        """A retry or hedge not sent (``kind``: ``retry``, ``hedge``, ``hedge_slow``)."""
        self._child(self.budget_denied, provider, kind).inc()

    def record_hedge(self, *, provider: str) -> None:
        """A hedge (second copy of a request) was sent to ``provider``."""
        self._child(self.hedges, provider).inc()

    def record_hedge_win(self, *, provider: str) -> None:
        """The hedge sent to ``provider`` answered first."""
        self._child(self.hedge_wins, provider).inc()

    def set_endpoint_health(self, *, provider: str, endpoint: str, healthy: bool) -> None:
        self._child(self.provider_healthy, provider, endpoint).set(1 if healthy else 0)

    def record_overhead(self, seconds: float) -> None:
        self.overhead.observe(seconds)

    def reconfigure(self, *, providers: Iterable[str], models: Iterable[str], endpoints: Iterable[tuple[str, str]]) -> None:
        """Adopt a reloaded config's label sets: ``models`` become the configured model
        names, and health series of ``(provider, endpoint)`` pairs no longer configured
        are dropped (counters keep their history, so rates stay continuous)."""
        self._providers = frozenset(providers)
        self._models = frozenset(models)
        keep = set(endpoints)
        for provider, endpoint in [labels for labels in self._health_labels() if labels not in keep]:
            self.provider_healthy.remove(provider, endpoint)
            self._children.pop((id(self.provider_healthy), provider, endpoint), None)

    def set_provider_info(self, providers: Iterable[tuple[str, str, str, str]]) -> None:
        """Export ``latgate_provider_info`` as 1 for each ``(provider, role, connector,
        engine)`` given (empty strings for unset fields); label sets of providers no
        longer configured are dropped."""
        wanted = set(providers)
        for labels in self._info_labels - wanted:
            self.provider_info.remove(*labels)
        for labels in wanted:
            self.provider_info.labels(*labels).set(1)
        self._info_labels = wanted

    def zero_event_counters(self, *, providers: Iterable[str], endpoints: Iterable[tuple[str, str]], ejection_reasons: Iterable[str]) -> None:
        """Export the rare-event counters at 0 before their first event: hedges, hedge
        wins and retries per provider, ejections per ``(provider, endpoint)`` and reason.

        Why: Prometheus computes ``rate()``/``increase()`` from samples it scraped, so a
        series that first appears at 1 shows no increase: the first hedge or ejection
        of a provider would be invisible on a dashboard. Series at 0 make it count.
        """
        for provider in providers:
            for counter in (self.hedges, self.hedge_wins, self.retries):
                self._child(counter, provider)
        reasons = tuple(ejection_reasons)
        for provider, endpoint in endpoints:
            for reason in reasons:
                self._child(self.ejections, provider, endpoint, reason)

    def create_series(self, served: Mapping[str, Iterable[str]]) -> None:
        """Export at 0, before any request, the series of every provider in ``served``
        (provider name -> the model labels its requests can carry): its in-flight
        gauge, and per model its TTFT and ITL histograms, its ``ok`` request count
        (code 200), e2e and tokens/s histograms and token counters (outcome ``ok``).
        So a panel or alert has a series to read from the start, and the first
        request of a provider shows as an increase. Called at start and on reload."""
        for provider, models in served.items():
            self._child(self.in_flight, provider)
            for source in ("predicted", "reported"):  # sessions (issue 21): the hit-ratio panel's series
                self._child(self.prompt_tokens_cached, provider, source)
            for model in models:
                label = self.model_label(model)
                self._child(self.requests, provider, label, "200")
                for histogram in (self.ttft, self.itl):
                    self._child(histogram, provider, label)
                for series in (self.e2e, self.tokens_per_second, self.prompt_tokens, self.completion_tokens):
                    self._child(series, provider, label, "ok")

    def _health_labels(self) -> list[tuple[str, str]]:
        health = id(self.provider_healthy)
        return [(key[1], key[2]) for key in self._children if len(key) == 3 and key[0] == health]

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for ``GET /metrics`` (every worker's
        samples, aggregated, when running as one of several workers)."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.multiprocess_dir)
        return generate_latest(registry), CONTENT_TYPE_LATEST
