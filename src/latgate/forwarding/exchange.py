"""One request's record: what was asked, where it went, its timings and its outcome.

An :class:`Exchange` is plain data: created when the gateway receives a request,
filled in by the handler, the forwarder and the relay, and handed exactly once,
whatever path the request took (answered, failed over, upstream error, client gone),
to the app's :class:`~latgate.forwarding.recorder.Recorder`, which turns it into metrics,
the access log line, the span's end and the ``/ui`` entry. Times are
``time.perf_counter()`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from latgate.forwarding.usage import cached_prompt_tokens, usage_counts
from latgate.foundation.errors import GatewayError, Overloaded

#: requests_total ``code`` for a client that went away before the response ended (nginx's).
CLIENT_CLOSED = 499
#: The cancellation message of a request cut at the drain deadline (``latgate serve``'s
#: SIGTERM drain, :mod:`latgate.process.lifecycle`): handlers answer it with an error (error
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
    finished: bool = False  # handed to the recorder (it records an exchange once)
    usage_estimated: bool = False  # no upstream usage: token counts are latgate's estimate
    cause: str | None = None  # why it failed short of an answer (no URL, no key, every endpoint out), logged
    fallback_model: str | None = None  # the model served instead of the requested one (X-Latgate-Fallback-Model)
    route_candidates: str | None = None  # the endpoints the plan looked at (X-Latgate-Route-Candidates, when explaining)
    admission: str | None = None  # how admission held it (X-Latgate-Admission, when explaining)
    # with tracing on (latgate.request.tracing): the W3C headers naming the request's span as the
    # upstream's parent, and the span itself, opaque here (the recorder's tracing ends it)
    trace_headers: dict[str, str] | None = None
    span: object | None = None
    limits_charged: bool = False  # its key's RPM/TPM charge was asked for (latgate.request.auth.limits)
    cached_prompt_tokens: int | None = None  # prompt tokens the upstream's usage says it served from its prefix cache
    # queue (issue 22): its class, whose fair share it is charged to, and how it waited
    priority: int = 1  # latgate.routing.priority class number (1: default)
    tenant: str = ""  # the key's name, else the client's address: its fair share in the gateway queue
    queue_ms: float | None = None  # time it waited in the gateway queue (X-Latgate-Queue-Ms); None: did not wait
    queue_outcome: str | None = None  # admitted, late, overflow, shed, preempted, requeued (access line)
    refused: bool = False  # latgate's own refusal, no provider's failure: counted under provider "none"
    # the completion tokens it is expected to produce and where that came from, computed once
    # (Selector.expected_completion) before its token limits; read by the queue and the plan
    expected_completion: tuple[int, str] | None = None

    def fail(self, error: GatewayError) -> None:
        """End with ``error``: its status and kind (the access line's ``error``), and
        ``refused`` for latgate's own limit (:class:`~latgate.foundation.errors.Overloaded`:
        a full queue's shed, a preemption's 503, latgate's upstream pool full)."""
        self.status = error.status
        self.error_kind = error.code or error.type
        self.refused = isinstance(error, Overloaded)

    def apply_usage(self, usage: dict[str, Any] | None) -> bool:
        """Take token counts from an OpenAI ``usage`` object when it has them (chat
        ``prompt_tokens``/``completion_tokens``, or the Responses API's
        ``input_tokens``/``output_tokens``, both non-negative integers:
        :func:`~latgate.forwarding.usage.usage_counts`). Returns False, changing nothing,
        when it has not (absent or malformed): the counts are then latgate's estimate.
        The prompt tokens served from the upstream's prefix cache are taken too, when it
        reports them (:func:`~latgate.forwarding.usage.cached_prompt_tokens`)."""
        counts = usage_counts(usage)
        if counts is None:
            return False
        self.prompt_tokens, self.completion_tokens = counts
        self.cached_prompt_tokens = cached_prompt_tokens(usage)
        return True
