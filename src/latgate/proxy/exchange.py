"""One request's record: what was asked, where it went, its timings and its outcome.

An :class:`Exchange` is created when the gateway receives a request and finished
exactly once, whatever path the request took (answered, failed over, upstream error,
client gone). :meth:`Exchange.finish` turns it into metrics and one structured access
log line: the route counted under the provider and reason the response headers named,
and the tokens and latency of a request that got any output counted under its
outcome (:func:`latgate.metrics.request_outcome`), a client that left or a stream
that broke included. Times are ``time.perf_counter()`` seconds.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from latgate.logs import access_log
from latgate.metrics import Metrics, request_outcome
from latgate.proxy.usage import cached_prompt_tokens, usage_counts
from latgate.routing.priority import CLASS_NAMES

if TYPE_CHECKING:
    from latgate.proxy.keepalive import EarlyHead
    from latgate.tracing import RequestTrace

#: requests_total ``code`` for a client that went away before the response ended (nginx's).
CLIENT_CLOSED = 499
#: The cancellation message of a request cut at the drain deadline (``latgate serve``'s
#: SIGTERM drain, :mod:`latgate.lifecycle`): handlers answer it with an error (error
#: kind ``drain_timeout``, status :data:`DRAIN_CUT_STATUS`) instead of a traceback.
DRAIN_CUT = "latgate: drain timeout"
DRAIN_CUT_STATUS = 503


def is_drain_cut(exc: BaseException) -> bool:
    """True for the cancellation of a request cut at the drain deadline."""
    return bool(exc.args) and exc.args[0] == DRAIN_CUT


@dataclass(slots=True)
class Exchange:
    """One request's record, shared by the handler, the forwarder and the relay.

    ``provider`` / ``endpoint`` / ``upstream_model`` are those of the attempt that
    answered (or the last one tried). ``prompt_tokens`` starts as latgate's estimate and
    is replaced by the upstream's ``usage`` when it reports one (access log, metrics);
    ``routed_prompt_tokens`` keeps the estimate routing used (``X-Latgate-Prompt-Tokens``).
    """

    request_id: str
    received_at: float
    path: str
    stream: bool
    public_model: str = ""
    upstream_model: str = ""
    provider: str = ""
    endpoint: str = ""
    reason: str = ""
    prompt_tokens: int = 0
    routed_prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    status: int = 0
    error_kind: str | None = None
    attempts: int = 0
    finished: bool = False
    usage_estimated: bool = False  # no upstream usage: token counts are latgate's estimate
    cause: str | None = None  # why it failed short of an answer (no URL, no key, every endpoint out), logged
    fallback_model: str | None = None  # the model served instead of the requested one (X-Latgate-Fallback-Model)
    route_candidates: str | None = None  # the endpoints the plan looked at (X-Latgate-Route-Candidates, when explaining)
    admission: str | None = None  # how admission held it (X-Latgate-Admission, when explaining)
    trace: RequestTrace | None = None  # the request's span, with tracing on (latgate.tracing)
    recent: deque[tuple] | None = None  # the /ui ring this exchange's summary joins when finished (latgate.ui)
    early: EarlyHead | None = None  # a stream that may send its head before content (latgate.proxy.keepalive)
    limits_charged: bool = False  # its key's RPM/TPM charge was asked for (latgate.auth.limits)
    cached_prompt_tokens: int | None = None  # prompt tokens the upstream's usage says it served from its prefix cache
    # queue (issue 22): its class, whose fair share it is charged to, and how it waited
    priority: int = 1  # latgate.routing.priority class number (1: default)
    tenant: str = ""  # the key's name, else the client's address: its fair share in the gateway queue
    queue_ms: float | None = None  # time it waited in the gateway queue (X-Latgate-Queue-Ms); None: did not wait
    queue_outcome: str | None = None  # admitted, overflow, shed, preempted, requeued (access line)

    def apply_usage(self, usage: dict[str, Any] | None) -> bool:
        """Take token counts from an OpenAI ``usage`` object when it has them (chat
        ``prompt_tokens``/``completion_tokens``, or the Responses API's
        ``input_tokens``/``output_tokens``, both non-negative integers:
        :func:`~latgate.proxy.usage.usage_counts`). Returns False, changing nothing,
        when it has not (absent or malformed): the counts are then latgate's estimate.
        The prompt tokens served from the upstream's prefix cache are taken too, when it
        reports them (:func:`~latgate.proxy.usage.cached_prompt_tokens`)."""
        counts = usage_counts(usage)
        if counts is None:
            return False
        self.prompt_tokens, self.completion_tokens = counts
        self.cached_prompt_tokens = cached_prompt_tokens(usage)
        return True

    def finish(self, metrics: Metrics, *, now: float | None = None) -> None:
        """Record metrics and the access log line (idempotent)."""
        if self.finished:
            return
        self.finished = True
        end = time.perf_counter() if now is None else now
        e2e = end - self.received_at
        if self.recent is not None:
            # a tuple of atoms, not the exchange: the collector stops tracking it, and
            # nothing else (body, trace) is kept alive by the ring
            self.recent.append(
                (self.request_id, self.received_at, end, self.path, self.public_model, self.provider, self.endpoint,
                 self.reason, self.stream, self.status, self.error_kind, self.first_token_at, self.last_token_at,
                 self.completion_tokens, self.attempts)
            )
        if self.trace is not None:
            self.trace.end(self)
        provider = self.provider or "none"
        metrics.record_request(provider=provider, model=self.public_model, code=self.status)
        if self.provider:
            # what the headers said: the provider that answered and its route reason
            metrics.record_route(provider=provider, reason=self.reason)
            if 200 <= self.status < 300 or self.first_token_at is not None:  # answered, or output began
                decode = None
                if self.first_token_at is not None and self.last_token_at is not None:
                    decode = self.last_token_at - self.first_token_at
                metrics.record_completion(
                    provider=provider,
                    model=self.public_model,
                    e2e_seconds=e2e,
                    prompt_tokens=self.prompt_tokens,
                    completion_tokens=self.completion_tokens,
                    decode_seconds=decode,
                    outcome=request_outcome(self.status),
                )
        if access_log.enabled():
            ttft = None if self.first_token_at is None else round((self.first_token_at - self.received_at) * 1000, 3)
            line = {
                "request_id": self.request_id,
                "path": self.path,
                "provider": self.provider or None,
                "endpoint": self.endpoint or None,
                "model": self.public_model,
                "upstream_model": self.upstream_model or None,
                "reason": self.reason or None,
                "stream": self.stream,
                "status": self.status,
                "error": self.error_kind,
                "attempts": self.attempts,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "usage_estimated": self.usage_estimated,
                "ttft_ms": ttft,
                "e2e_ms": round(e2e * 1000, 3),
            }
            if self.cached_prompt_tokens is not None:
                line["cached_prompt_tokens"] = self.cached_prompt_tokens
            if self.cause is not None:
                line["cause"] = self.cause
            line["priority"] = CLASS_NAMES[self.priority]
            if self.queue_outcome is not None:  # it waited in, or was shed by, the gateway queue
                line["queue_ms"] = None if self.queue_ms is None else round(self.queue_ms, 3)
                line["queue_outcome"] = self.queue_outcome
            access_log.write(orjson.dumps(line).decode())
