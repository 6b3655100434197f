"""Optional OpenTelemetry tracing: one SERVER span per proxied request.

Off unless the OpenTelemetry SDK is installed (``pip install 'latgate[tracing]'``) and
configured the standard way, by ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER`` (``otlp`` or
``console``; ``none`` turns it off). When off the app's
:class:`~latgate.forwarding.recorder.Recorder` holds ``None`` and a request pays one
``is None`` check where its record is created, one per attempt and one where it is
finished (the record's ``trace_headers`` and ``span`` stay ``None``). When on,
:class:`Tracing` is the recorder's span sink: :meth:`Tracing.begin` starts a span with
the record, :meth:`Tracing.end` ends it when the record is finished.

A span starts from the client's W3C Trace Context (``traceparent``/``tracestate``,
https://www.w3.org/TR/trace-context/) when it sent one, and its context goes upstream
in the same two headers, so an engine that traces joins the client's trace as a child
of latgate's span. Attributes follow the OpenTelemetry HTTP and GenAI semantic
conventions where they fit, plus ``latgate.*`` for routing; never prompt text or keys.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the SDK is an optional extra
    from opentelemetry.sdk.trace import TracerProvider

    from latgate.forwarding.exchange import Exchange

log = logging.getLogger("latgate")

#: Proxied paths (below ``/v1``) that get a span, with their GenAI operation name.
TRACED_PATHS: dict[str, str] = {
    "/chat/completions": "chat",
    "/completions": "text_completion",
    "/embeddings": "embeddings",
    "/messages": "chat",
    "/responses": "chat",
}
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
EXPORTERS = ("otlp", "console")


class RequestTrace:
    """One request's span: its context for upstream headers, ended with the record."""

    __slots__ = ("_context", "_propagator", "_span")

    def __init__(self, *, span: Any, propagator: Any, context: Any) -> None:
        self._span = span
        self._propagator = propagator
        self._context = context

    def upstream_headers(self) -> dict[str, str]:
        """``traceparent`` (and ``tracestate`` when there is one) naming this span as
        the parent of the upstream's work (W3C Trace Context)."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._context)
        return carrier

    def end(self, exchange: Exchange) -> None:
        """Set the outcome attributes from the finished ``exchange`` and end the span;
        status ERROR on a 5xx."""
        from opentelemetry.trace import Status, StatusCode

        span = self._span
        ttft_ms = None
        if exchange.first_token_at is not None:
            ttft_ms = round((exchange.first_token_at - exchange.received_at) * 1000, 3)
        attributes: dict[str, Any] = {
            "http.response.status_code": exchange.status,
            "latgate.attempts": exchange.attempts,
            "gen_ai.usage.input_tokens": exchange.prompt_tokens,
            "gen_ai.usage.output_tokens": exchange.completion_tokens,
            "latgate.request_id": exchange.request_id,
        }
        optional = {
            "gen_ai.request.model": exchange.public_model,
            "gen_ai.response.model": exchange.upstream_model,
            "latgate.provider": exchange.provider,
            "latgate.endpoint": exchange.endpoint,
            "latgate.route.reason": exchange.reason,
            "error.type": exchange.error_kind,
            "latgate.ttft_ms": ttft_ms,
        }
        attributes.update({key: value for key, value in optional.items() if value not in (None, "")})
        span.set_attributes(attributes)
        if exchange.status >= 500:
            span.set_status(Status(StatusCode.ERROR, exchange.error_kind or None))
        span.end()


class Tracing:
    """Starts request spans on ``provider``'s tracer.

    Args:
        provider: an OpenTelemetry SDK ``TracerProvider`` with its exporters attached
            (tests: an ``InMemorySpanExporter``); see :func:`tracing_from_env`.
    """

    def __init__(self, *, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("latgate")
        self.propagator = TraceContextTextMapPropagator()

    def start(self, *, path: str, headers: Mapping[str, str]) -> RequestTrace | None:
        """A SERVER span named ``POST /v1{path}``, child of the client's
        ``traceparent`` when valid; ``None`` for a path that is not proxied."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        operation = TRACED_PATHS.get(path)
        if operation is None:
            return None
        parent = self.propagator.extract(headers)
        route = "/v1" + path
        span = self.tracer.start_span(
            "POST " + route,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": "POST",
                "http.route": route,
                "url.path": route,
                "gen_ai.operation.name": operation,
            },
        )
        return RequestTrace(span=span, propagator=self.propagator, context=set_span_in_context(span))

    def begin(self, exchange: Exchange, *, path: str, headers: Mapping[str, str]) -> None:
        """Start ``exchange``'s span (:meth:`start`) when ``path`` is proxied: the span
        goes on the record (``span``), and the headers naming it as the upstream's
        parent (``trace_headers``, sent with every attempt)."""
        trace = self.start(path=path, headers=headers)
        if trace is not None:
            exchange.span = trace
            exchange.trace_headers = trace.upstream_headers()

    def end(self, exchange: Exchange) -> None:
        """End the span :meth:`begin` put on the finished ``exchange`` (see
        :meth:`RequestTrace.end`); nothing when it has none."""
        trace = exchange.span
        if isinstance(trace, RequestTrace):
            trace.end(exchange)

    def shutdown(self) -> None:
        """Flush and stop the exporters."""
        self.provider.shutdown()


def tracing_wanted(env: Mapping[str, str]) -> bool:
    """Whether ``env`` asks for traces: an OTLP endpoint or an ``OTEL_TRACES_EXPORTER``
    other than ``none`` (``OTEL_SDK_DISABLED=true`` wins)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def tracing_from_env(env: Mapping[str, str]) -> Tracing | None:
    """Tracing configured by the standard OpenTelemetry variables in ``env``, or
    ``None`` when they do not ask for it, the SDK is not installed or the exporter is
    unknown (one log line for each of the last two; never raises for them).

    The exporter (``OTEL_TRACES_EXPORTER``, default ``otlp``) is ``otlp`` (OTLP over
    HTTP/protobuf, which reads its own ``OTEL_EXPORTER_OTLP_*`` settings) or
    ``console``; spans go out in batches. ``OTEL_SERVICE_NAME`` defaults to latgate.
    """
    if not tracing_wanted(env):
        return None
    exporter_name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    if exporter_name not in EXPORTERS:
        log.warning(
            "tracing off: OTEL_TRACES_EXPORTER=%s is not one of %s", exporter_name, ", ".join(EXPORTERS)
        )
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        if exporter_name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter: Any = OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter()
    except ImportError as error:
        log.warning(
            "tracing off: OTEL_* variables ask for traces but the OpenTelemetry SDK or exporter is not"
            " installed (no module %s; pip install 'latgate[tracing]')",
            error.name or "opentelemetry",
        )
        return None
    service = env.get("OTEL_SERVICE_NAME", "").strip() or "latgate"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on: %s exporter, service %s", exporter_name, service)
    return Tracing(provider=provider)
