"""Where finished requests go: one :class:`Recorder` per app, whose sinks are the
metrics, the access log, the request's span and the ``/ui`` ring.

A request's :class:`~latgate.forwarding.exchange.Exchange` is plain data; whoever ends the
request (the serve path, the relay, the keep-alive stream, the answer once sent) hands
it to :meth:`Recorder.finish`, exactly once in effect (a second call does nothing).
The route is counted under the provider and reason the response headers named, and
the tokens and latency of a request that got any output under its outcome
(:func:`latgate.foundation.metrics.request_outcome`), a client that left or a stream that broke
included. The access log line and its fields: docs/metrics.md, "Logs".

The recorder outlives config reloads (the app builds it once, every
:class:`~latgate.request.gateway.Gateway` shares it), as the metrics, the span exporter and the
``/ui`` ring do.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from latgate.forwarding.exchange import Exchange
from latgate.foundation.logs import access_log
from latgate.foundation.metrics import Metrics, request_outcome
from latgate.routing.priority import CLASS_NAMES


class SpanSink(Protocol):
    """What the recorder asks of tracing (:class:`latgate.request.tracing.Tracing`)."""

    def begin(self, exchange: Exchange, *, path: str, headers: Mapping[str, str]) -> None:
        """Start ``exchange``'s span (setting its ``span`` and ``trace_headers``) when
        ``path`` (the API's name, ``/chat/completions``...) is traced."""

    def end(self, exchange: Exchange) -> None:
        """End ``exchange``'s span (its ``span`` is set) with the outcome's attributes."""


class Recorder:
    """Records finished exchanges.

    Args:
        metrics: the app's metrics (requests, routes, completions).
        tracing: ends each request's span; ``None``: tracing off (a request then pays
            one ``is None`` check where its record is created, none here).
        recent: the ``/ui`` ring (:class:`latgate.app.ui.activity.Activity`) each finished
            request's summary joins; ``None``: no ring.

    The access log is :data:`latgate.foundation.logs.access_log` (written when enabled).
    """

    __slots__ = ("metrics", "recent", "tracing")

    def __init__(self, *, metrics: Metrics, tracing: SpanSink | None = None, recent: deque[tuple[Any, ...]] | None = None) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self.recent = recent

    def finish(self, exchange: Exchange, *, now: float | None = None, listed: bool = True) -> None:
        """Record ``exchange`` (ended at ``now``, ``time.perf_counter()`` seconds, by
        default the time of the call): the ``/ui`` ring when ``listed`` (a connection
        refused before any request is not), its span, metrics, the access log line.
        Idempotent: an exchange already finished is left as it is."""
        if exchange.finished:
            return
        exchange.finished = True
        end = time.perf_counter() if now is None else now
        if listed and self.recent is not None:
            # a tuple of atoms, not the exchange: the collector stops tracking it, and
            # nothing else (body, span) is kept alive by the ring
            self.recent.append(
                (exchange.request_id, exchange.received_at, end, exchange.path, exchange.public_model, exchange.provider,
                 exchange.endpoint, exchange.reason, exchange.stream, exchange.status, exchange.error_kind,
                 exchange.first_token_at, exchange.last_token_at, exchange.completion_tokens, exchange.attempts)
            )  # fmt: skip
        if exchange.span is not None and self.tracing is not None:
            self.tracing.end(exchange)
        self._count(exchange, end - exchange.received_at)
        if access_log.enabled():
            access_log.write(access_line(exchange, end))

    def _count(self, exchange: Exchange, e2e_seconds: float) -> None:
        metrics = self.metrics
        provider = exchange.provider or "none"
        # latgate's own refusals (no provider took it, or its limit, its queue, a preemption) under "none"
        answered_by = "none" if exchange.refused else provider
        metrics.record_request(provider=answered_by, model=exchange.public_model, code=exchange.status)
        if not exchange.provider:
            return
        # what the headers said: the provider that answered and its route reason
        metrics.record_route(provider=provider, reason=exchange.reason)
        if 200 <= exchange.status < 300 or exchange.first_token_at is not None:  # answered, or output began
            decode = None
            if exchange.first_token_at is not None and exchange.last_token_at is not None:
                decode = exchange.last_token_at - exchange.first_token_at
            metrics.record_completion(
                provider=provider,
                model=exchange.public_model,
                e2e_seconds=e2e_seconds,
                prompt_tokens=exchange.prompt_tokens,
                completion_tokens=exchange.completion_tokens,
                decode_seconds=decode,
                outcome=request_outcome(exchange.status),
            )


def access_line(exchange: Exchange, end: float) -> str:
    """The access log line (one JSON object) of ``exchange`` ended at ``end``
    (``time.perf_counter()`` seconds); times in milliseconds."""
    ttft = None if exchange.first_token_at is None else round((exchange.first_token_at - exchange.received_at) * 1000, 3)
    line = {
        "request_id": exchange.request_id,
        "path": exchange.path,
        "provider": exchange.provider or None,
        "endpoint": exchange.endpoint or None,
        "model": exchange.public_model,
        "upstream_model": exchange.upstream_model or None,
        "reason": exchange.reason or None,
        "stream": exchange.stream,
        "status": exchange.status,
        "error": exchange.error_kind,
        "attempts": exchange.attempts,
        "prompt_tokens": exchange.prompt_tokens,
        "completion_tokens": exchange.completion_tokens,
        "usage_estimated": exchange.usage_estimated,
        "ttft_ms": ttft,
        "e2e_ms": round((end - exchange.received_at) * 1000, 3),
    }
    if exchange.cached_prompt_tokens is not None:
        line["cached_prompt_tokens"] = exchange.cached_prompt_tokens
    if exchange.cause is not None:
        line["cause"] = exchange.cause
    line["priority"] = CLASS_NAMES[exchange.priority]
    if exchange.queue_outcome is not None:  # it waited in, or was shed by, the gateway queue
        line["queue_ms"] = None if exchange.queue_ms is None else round(exchange.queue_ms, 3)
        line["queue_outcome"] = exchange.queue_outcome
    return orjson.dumps(line).decode()
