"""Recent requests and routing events for ``/ui``.

The request path pays one ``deque.append`` of a tuple summarising the finished
:class:`~latgate.forwarding.exchange.Exchange` (see :meth:`Recorder.finish
<latgate.forwarding.recorder.Recorder.finish>`, field order as :func:`_request_json` reads it); turning them into JSON, and noticing counters that moved,
happens only in :meth:`Activity.snapshot`, i.e. when the page polls.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from latgate.foundation.metrics import Metrics

#: finished requests the ring keeps (the page's request list)
RECENT_REQUESTS = 300
#: counter-derived events kept (hedges, fallbacks, retries, ejections)
RECENT_EVENTS = 200
#: route reason prefixes that are events in their own right
REASON_EVENTS = {"overflow": "overflow", "waited": "admission wait", "late": "served late", "predicted_miss": "predicted miss"}


class Activity:
    """The ring of recent requests and the events the page lists; one per app (it
    outlives config reloads).

    Args:
        metrics: the app's metrics, whose event counters are compared between polls.
        size: how many finished requests the ring keeps.
    """

    def __init__(self, metrics: Metrics, *, size: int = RECENT_REQUESTS) -> None:
        self.requests: deque[tuple[Any, ...]] = deque(maxlen=size)
        self.events: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)
        self._metrics = metrics
        self._counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._counters = (
            (metrics.hedges, "hedge"),
            (metrics.hedge_wins, "hedge won"),
            (metrics.fallbacks, "fallback"),
            (metrics.retries, "retry"),
            (metrics.ejections, "ejection"),
        )

    def snapshot(self) -> dict[str, Any]:
        """``{"requests": [...], "events": [...]}``, newest first. Requests:
        ``{id, at (epoch s, finished), path, model, provider, endpoint, reason, stream,
        status, error, ttft_ms, e2e_ms, completion_tokens, tokens_per_second, attempts}``;
        events: ``{at, kind, provider, detail, count}``."""
        wall_minus_perf = time.time() - time.perf_counter()
        self._note_counters(time.time())
        requests = [_request_json(ex, wall_minus_perf) for ex in reversed(self.requests)]
        events = list(self.events)
        for request in requests:
            prefix, _, source = request["reason"].partition(":")
            kind = REASON_EVENTS.get(prefix)
            if kind is not None:
                detail = f"{source} -> {request['provider']}" if source else request["provider"]
                events.append({"at": request["at"], "kind": kind, "provider": request["provider"], "detail": detail, "count": 1})
        events.sort(key=lambda e: e["at"], reverse=True)
        return {"requests": requests, "events": events[:RECENT_EVENTS]}

    def _note_counters(self, now: float) -> None:
        for counter, kind in self._counters:
            for metric in counter.collect():
                for sample in metric.samples:
                    if not sample.name.endswith("_total"):
                        continue
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    moved = sample.value - self._counts.get(key, 0.0)
                    self._counts[key] = sample.value
                    if moved > 0:
                        self.events.append({"at": now, "kind": kind, "count": int(moved), **_describe(sample.labels)})


def _describe(labels: dict[str, str]) -> dict[str, str]:
    if "from" in labels:
        return {"provider": labels["to"], "detail": f"{labels['from']} -> {labels['to']}"}
    detail = labels["provider"]
    if "endpoint" in labels:
        detail = f"{labels['endpoint']} ({labels.get('reason', '')})"
    return {"provider": labels["provider"], "detail": detail}


def _request_json(entry: tuple[Any, ...], wall_minus_perf: float) -> dict[str, Any]:
    (request_id, received_at, finished_at, path, model, provider, endpoint, reason, stream, status, error,
     first_token_at, last_token_at, completion_tokens, attempts) = entry
    ttft = None if first_token_at is None else round((first_token_at - received_at) * 1000, 1)
    speed = None
    if first_token_at is not None and last_token_at is not None and completion_tokens > 1:
        decode = last_token_at - first_token_at
        if decode > 0:
            speed = round(completion_tokens / decode, 1)
    return {
        "id": request_id,
        "at": round(finished_at + wall_minus_perf, 3),
        "path": path,
        "model": model,
        "provider": provider or "none",
        "endpoint": endpoint,
        "reason": reason,
        "stream": stream,
        "status": status,
        "error": error,
        "ttft_ms": ttft,
        "e2e_ms": round((finished_at - received_at) * 1000, 1),
        "completion_tokens": completion_tokens,
        "tokens_per_second": speed,
        "attempts": attempts,
    }
