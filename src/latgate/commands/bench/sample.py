"""One measured request: what the client saw, when, and how it ended.

``SampleRecorder`` is fed events with explicit timestamps (seconds from any monotonic
clock), so the measurement rules are plain code that tests can drive with made-up
times; ``runner.py`` feeds it from a live HTTP response. The rules:

- TTFT: from sending the request to the first chunk whose ``choices[].delta`` carries
  generated output (non-empty ``content``, ``reasoning_content``/``reasoning`` or
  ``tool_calls``); the role-only first chunk and the usage chunk do not count.
- e2e: from sending the request to the end of the response (``data: [DONE]``, or the
  last byte when the stream ends without it).
- completion tokens: ``usage.completion_tokens`` when the server reports it
  (``stream_options.include_usage``), else the number of output chunks.
- tokens/s (decode rate): completion tokens / (last output chunk time - first output
  chunk time), as a client measures it, the span floored per token so a burst is not
  an unbounded rate (:mod:`latgate.foundation.decode_rate`); undefined for fewer than two tokens
  or when all output arrived at once.
  ``e2e_tokens_per_second`` is completion tokens / e2e, which includes the TTFT.
- ITL: the gaps between consecutive output chunks, in ms.

Chunk shapes are those of the OpenAI API reference ("The chat completion chunk
object"); an ``{"error": ...}`` event mid-stream counts as a ``stream_error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from latgate.foundation.decode_rate import decode_tokens_per_second
from latgate.routing.tokens import estimate_text_tokens

_OUTPUT_DELTA_KEYS = ("content", "reasoning_content", "reasoning", "tool_calls")
_MESSAGE_SNIPPET_CHARS = 200


@dataclass(slots=True, kw_only=True)
class RequestSample:
    """The measurements of one request (times in ms, rates in tokens/s).

    ``ok`` is true for a 2xx response read to its end without an error. A failed
    request has ``error_kind``: ``http_<status>``, ``connect_error``, ``timeout``,
    ``read_error`` (connection dropped mid-response), ``stream_error`` (an error event
    in the stream), ``incomplete_stream`` (ended without ``[DONE]`` or a
    ``finish_reason``), ``bad_response`` (unparseable body) or ``transport_error``.
    ``provider`` and ``route_reason`` are latgate's ``X-Latgate-Provider`` and
    ``X-Latgate-Route-Reason`` response headers (``None`` when absent). The defaults
    are a request's before anything of its response is known (:class:`SampleRecorder`
    fills the sample in as the response arrives).
    """

    index: int
    ok: bool = False
    status_code: int | None = None
    error_kind: str | None = None
    error_message: str | None = None
    provider: str | None = None
    route_reason: str | None = None
    ttft_ms: float | None = None
    e2e_ms: float = 0.0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    usage_reported: bool = False
    output_chunks: int = 0
    tokens_per_second: float | None = None
    e2e_tokens_per_second: float | None = None
    finish_reason: str | None = None
    itl_ms: list[float] = field(default_factory=list)


class SampleRecorder:
    """Accumulates one request's events into a ``RequestSample``.

    Parameters:
        index: the request's number in the run (0-based).
        started_at: when the request was sent, in seconds of the caller's clock.

    Call ``on_response`` once headers arrive, then ``on_event`` per SSE data payload
    (or ``on_json_body`` for a non-streamed reply, or ``on_error_body`` for an HTTP
    error), ``fail`` on a transport error, and finally ``finish``.
    """

    __slots__ = (
        "_done_at",
        "_first_output_at",
        "_last_output_at",
        "_non_stream_at",
        "_non_stream_tokens",
        "_sample",
        "_started_at",
        "_usage_completion_tokens",
    )

    def __init__(self, *, index: int, started_at: float) -> None:
        self._sample = RequestSample(index=index)
        self._started_at = started_at
        self._first_output_at: float | None = None
        self._last_output_at: float | None = None
        self._usage_completion_tokens: int | None = None
        self._done_at: float | None = None
        self._non_stream_tokens: int | None = None
        self._non_stream_at: float | None = None

    @property
    def done(self) -> bool:
        """True once ``[DONE]`` was seen or the request failed: later events are ignored."""
        return self._done_at is not None or self._sample.error_kind is not None

    def on_response(self, *, status_code: int, headers: Mapping[str, str]) -> None:
        """The response's status and headers (a case-insensitive mapping, or lower-case keys)."""
        self._sample.status_code = status_code
        self._sample.provider = headers.get("x-latgate-provider")
        self._sample.route_reason = headers.get("x-latgate-route-reason")

    def on_event(self, data: bytes, *, at: float) -> None:
        """One SSE data payload (UTF-8 JSON or ``[DONE]``) received at ``at`` (seconds)."""
        if self.done:
            return
        if data == b"[DONE]":
            self._done_at = at
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.fail(kind="bad_response", message=f"unparseable stream event: {data[:80]!r}")
            return
        if not isinstance(chunk, dict):
            self.fail(kind="bad_response", message=f"stream event is not an object: {data[:80]!r}")
            return
        if chunk.get("error") is not None:
            self.fail(kind="stream_error", message=_error_message(chunk))
            return
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if any(delta.get(key) for key in _OUTPUT_DELTA_KEYS):
                self._record_output(at)
            if choice.get("finish_reason"):
                self._sample.finish_reason = choice["finish_reason"]
        self._record_usage(chunk.get("usage"))

    def on_json_body(self, body: bytes, *, at: float) -> None:
        """A complete non-streamed chat completion received at ``at`` (seconds)."""
        try:
            reply = orjson.loads(body)
            choice = reply["choices"][0]
            message = choice.get("message") or {}
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            self.fail(kind="bad_response", message=f"not a chat completion: {body[:80]!r}")
            return
        self._sample.finish_reason = choice.get("finish_reason")
        self._record_usage(reply.get("usage"))
        text = (message.get("content") or "") + (message.get("reasoning_content") or "")
        self._non_stream_tokens = estimate_text_tokens(text)
        self._non_stream_at = at
        self._done_at = at

    def on_error_body(self, body: bytes) -> None:
        """The body of an HTTP error response (status from ``on_response``)."""
        try:
            message = _error_message(orjson.loads(body))
        except orjson.JSONDecodeError:
            message = body[:_MESSAGE_SNIPPET_CHARS].decode("utf-8", "replace")
        self.fail(kind=f"http_{self._sample.status_code}", message=message)

    def fail(self, *, kind: str, message: str) -> None:
        """Mark the request failed; the first failure wins."""
        if self._sample.error_kind is None:
            self._sample.error_kind = kind
            self._sample.error_message = message[:_MESSAGE_SNIPPET_CHARS]

    def finish(self, *, at: float) -> RequestSample:
        """The sample, with the response ending at ``at`` (seconds) unless ``[DONE]`` came first."""
        if self._sample.error_kind is None and self._done_at is None and self._sample.finish_reason is None:
            self.fail(kind="incomplete_stream", message="stream ended without [DONE] or finish_reason")
        ended_at = self._done_at if self._done_at is not None else at
        e2e_seconds = ended_at - self._started_at
        tokens = self._completion_tokens()
        ttft_ms = None
        if self._non_stream_at is not None:
            ttft_ms = (self._non_stream_at - self._started_at) * 1000.0
        elif self._first_output_at is not None:
            ttft_ms = (self._first_output_at - self._started_at) * 1000.0
        decode_rate = None
        if tokens is not None and self._first_output_at is not None and self._last_output_at is not None:
            decode_rate = decode_tokens_per_second(tokens, self._last_output_at - self._first_output_at)
        sample = self._sample
        ok = sample.error_kind is None
        sample.ok = ok
        sample.ttft_ms = ttft_ms
        sample.e2e_ms = e2e_seconds * 1000.0
        sample.completion_tokens = tokens
        sample.usage_reported = self._usage_completion_tokens is not None
        sample.tokens_per_second = decode_rate if ok else None
        sample.e2e_tokens_per_second = tokens / e2e_seconds if ok and tokens and e2e_seconds > 0 else None
        return sample

    def _record_output(self, at: float) -> None:
        last = self._last_output_at  # None exactly when _first_output_at is
        if last is None:
            self._first_output_at = at
        else:
            self._sample.itl_ms.append((at - last) * 1000.0)
        self._last_output_at = at
        self._sample.output_chunks += 1

    def _record_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self._usage_completion_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self._sample.prompt_tokens = usage["prompt_tokens"]

    def _completion_tokens(self) -> int | None:
        if self._usage_completion_tokens is not None:
            return self._usage_completion_tokens
        if self._non_stream_tokens is not None:
            return self._non_stream_tokens
        if self._sample.status_code is not None and 200 <= self._sample.status_code < 300:
            return self._sample.output_chunks
        return None


def _error_message(payload: Any) -> str:
    """The ``error.message`` of an OpenAI error envelope, else the payload as text."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(payload)[:_MESSAGE_SNIPPET_CHARS]
