"""The stream relay: an ASGI response that passes upstream SSE bytes to the client as they
arrive, taps them for timing and usage, and closes the upstream when done or when the
client goes away.

Why not Starlette's ``StreamingResponse``: the relay needs to (a) stop at once when the
client disconnects even while the upstream is silent, (b) time the moment each
generated-content chunk was handed to the server, and (c) end a broken stream with an
error event. ``StreamingResponse`` does (a) with a task group per response; doing it
here with one watcher task keeps the per-chunk path to one ``send`` call.

An upstream that finished every choice and closed without ``data: [DONE]`` gets one
appended (the OpenAI SDKs and most clients wait for it). After output began, a failing
upstream (a broken connection, an in-band error event, an event whose data is not JSON
or an error written into the text, whose text is redacted, or a close before every choice had its
``finish_reason``: see :func:`~latgate.forwarding.sse.stream_unfinished`) ends the stream
with one SSE error event
``data: {"error": {...}}`` and no ``[DONE]``, so clients see a failure rather than a
silently truncated answer (the OpenAI Python SDK raises ``APIError`` on such an event).
A stream the engine itself ended with ``finish_reason: "abort"`` is relayed as the
engine wrote it, and recorded as the upstream's failure (status 502, error
``aborted``; passive health), not as a success.

Two bounds hold a stream that goes on without end (issue 23): ``max_stream_sec`` (from
the request's arrival, checked at each read; latgate's own limit, status 504, error ``stream_max_duration``,
nothing against the upstream's health), and, after the first content, reads that bring
no content (keep-alive comments, empty deltas) for longer than ``timeout_sec`` since
the last content: the upstream's failure, as silence is (``stream_timeout``). Either
ends the stream with an error event in the route's envelope and no ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import orjson
from starlette.types import Message, Receive, Scope, Send

from latgate.forwarding.exchange import CLIENT_CLOSED, DRAIN_CUT_STATUS, Exchange, is_drain_cut
from latgate.forwarding.recorder import Recorder
from latgate.forwarding.redact import redact_text
from latgate.forwarding.sse import StreamTap, stream_unfinished
from latgate.forwarding.transform import ResponseTransform
from latgate.foundation.config.schema import Config
from latgate.foundation.scope_keys import TIMEOUT_SCOPE_KEY
from latgate.transport.upstream import UpstreamFailure, upstream_errors


class _MaxDuration(Exception):
    """The stream passed its ``max_stream_sec``."""


def max_stream_seconds(config: Config, policy: str | None, provider: str) -> float:
    """The stream's ``max_stream_sec``: its route policy's, else the provider's, else
    ``[defaults]``'s (seconds; 0: no bound)."""
    chosen = config.routing.policies.get(policy) if policy else None
    if chosen is not None and chosen.max_stream_sec is not None:
        return chosen.max_stream_sec
    own = config.providers[provider].max_stream_sec
    return config.defaults.max_stream_sec if own is None else own


def error_event(message: str, *, code: str = "upstream_error") -> bytes:
    """One SSE event carrying an OpenAI error object."""
    return b"data: " + orjson.dumps({"error": {"message": message, "type": "api_error", "param": None, "code": code}}) + b"\n\n"


@dataclass(slots=True, kw_only=True, eq=False)
class StreamRelay:
    """ASGI app relaying one upstream stream.

    Args:
        headers: raw response headers for the client.
        head: bytes already read from the upstream and not yet forwarded (the events
            read while waiting for the first generated content).
        head_units: content units in ``head``.
        body: the rest of the upstream body (raw reads).
        tap: the stream's tap (already fed ``head``).
        exchange: the request record; handed to ``recorder`` when the stream ends.
        recorder: where the finished record goes; its metrics time TTFT / ITL.
        on_close: awaited once at the end (closes the upstream response, releases the
            in-flight slot).
        on_upstream_failure: called with the failure kind when the upstream breaks
            mid-stream (passive health).
        transform: converts forwarded events to another dialect (see
            :mod:`latgate.forwarding.transform`); ``None`` relays bytes untouched.
        secrets: the provider's key, redacted from any upstream error text.
        max_stream_seconds: the longest the stream may last from the request's arrival
            (0: no bound).
        quiet_seconds: after content, the longest reads may bring no content
            (``timeout_sec``; ``None``: no bound).

    ``head_sent`` is set when the response head already went out (with keep-alives,
    :mod:`latgate.forwarding.keepalive`): the relay then sends the body only.
    """

    headers: list[tuple[bytes, bytes]]
    head: bytes
    head_units: int
    body: AsyncIterator[bytes]
    tap: StreamTap
    exchange: Exchange
    recorder: Recorder
    on_close: Callable[[], Awaitable[object]]
    on_upstream_failure: Callable[[str], None]
    transform: ResponseTransform | None = None
    secrets: tuple[bytes, ...] = ()
    max_stream_seconds: float = 0.0
    quiet_seconds: float | None = None
    head_sent: bool = field(default=False, init=False)
    _gaps: list[float] = field(default_factory=list, init=False)  # seconds between consecutive reads that carried content

    def abort(self) -> None:
        """Close the upstream connection at once, for a relay that will not be sent (a held
        ``batch`` stream preempted: :mod:`latgate.routing.queue_preempt`), so the engine
        stops generating it (vLLM aborts a request whose client went away); ``on_close``
        still releases its slot. Idempotent; nothing for a body that cannot close its
        connection (latgate's HTTP/1.1 response can: ``close_connection``)."""
        close_connection = getattr(self.body, "close_connection", None)
        if close_connection is not None:
            close_connection()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ex = self.exchange
        state = {"closing": False, "disconnected": False}
        task = asyncio.current_task()
        assert task is not None

        def disconnected() -> None:
            if not state["closing"]:
                state["disconnected"] = True
                task.cancel()

        watcher = watch_disconnect(receive, disconnected)
        try:
            if not self.head_sent:
                await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            ex.status = 200
            await self._relay(send)
            state["closing"] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError as exc:
            if state["disconnected"]:
                task.uncancel()
                ex.status = CLIENT_CLOSED
                ex.error_kind = scope.get(TIMEOUT_SCOPE_KEY) or ex.error_kind  # send_timeout: it never read
            elif is_drain_cut(exc):  # shutting down: end the stream with an error, not silently
                task.uncancel()
                ex.status, ex.error_kind = DRAIN_CUT_STATUS, "drain_timeout"
                state["closing"] = True
                with contextlib.suppress(Exception):
                    await self._end_cut(send)
            else:
                raise
        except OSError:  # the server could not write: the client is gone
            ex.status = CLIENT_CLOSED
        finally:
            state["closing"] = True
            watcher.cancel()
            # the usage first: on_close's decode record reads its cached prompt tokens
            if not ex.apply_usage(self.tap.usage):  # absent or malformed: counted from the chunks
                ex.usage_estimated = True
            if ex.completion_tokens == 0:
                ex.completion_tokens = self.tap.content_chunks
            with contextlib.suppress(Exception):
                await self.on_close()
            self._observe_itl()
            if self.tap.aborted and ex.status == 200:
                self._fail("aborted", "the engine aborted the request")
            self.recorder.finish(ex)

    async def _relay(self, send: Send) -> None:
        if self.transform is not None:
            send = _transforming(send, self.transform)
        ex = self.exchange
        tap = self.tap
        observe_gap = self._gaps.append
        feed = tap.feed
        clock = time.perf_counter
        if self.head:
            await send({"type": "http.response.body", "body": self.head, "more_body": True})
            if self.head_units:
                self._first_token(clock())
        quiet = math.inf if self.quiet_seconds is None else self.quiet_seconds
        # checked at each read (no timer per stream): a silent upstream is cut by timeout_sec
        ends_at = ex.received_at + self.max_stream_seconds if self.max_stream_seconds else math.inf
        try:
            with upstream_errors():
                async for data in self.body if not tap.done else _nothing():
                    out, units = feed(data)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                        if units:
                            now = clock()
                            last = ex.last_token_at
                            if last is None:
                                self._first_token(now)
                            else:
                                observe_gap(now - last)
                                ex.last_token_at = now
                            if now > ends_at:
                                raise _MaxDuration
                    if tap.error is not None or tap.done:
                        break  # an in-band error, or the end: stop reading even if the upstream idles on
                    if not units:  # keep-alives after content do not hold a stream for ever
                        now = clock()
                        if now > ends_at:
                            raise _MaxDuration
                        if ex.last_token_at is not None and now - ex.last_token_at > quiet:
                            raise UpstreamFailure("timeout", f"only keep-alives for timeout_sec ({quiet:g} s) after content")
            failure = await self._end_read(send)
        except (UpstreamFailure, _MaxDuration) as err:
            failure = await self._end_failed(send, err)
        if self.transform is not None:
            await send({"type": "latgate.finish", "error": failure})
        elif failure is not None:
            await send({"type": "http.response.body", "body": error_event(failure), "more_body": True})

    async def _end_read(self, send: Send) -> str | None:
        """After the upstream's body ended (or the tap saw its end or an error): the
        bytes the tap still holds, and ``[DONE]`` when the upstream finished without it.
        Returns the client's message of a failure (recorded), ``None`` when the stream
        is whole."""
        tap = self.tap
        if tap.error is None and not tap.done:
            out, units = tap.flush()
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
                if units and self.exchange.first_token_at is None:
                    self._first_token(time.perf_counter())
        if tap.error is not None:
            return self._fail(tap.error_kind, redact_text(str(tap.error.get("message") or "error"), self.secrets))
        unfinished = stream_unfinished(tap)
        if unfinished is not None:
            return self._fail(*unfinished)
        if not tap.done and not tap.responses and self.transform is None:
            await send({"type": "http.response.body", "body": tap.done_event(), "more_body": True})
        return None

    async def _end_failed(self, send: Send, err: UpstreamFailure | _MaxDuration) -> str:
        """A stream cut by the upstream's failure or by ``max_stream_sec``: the failure
        recorded, the whole events the tap held sent on. Returns the client's message.

        A partial trailing event is dropped (the SSE spec discards an event cut before
        its blank line), so the error event that follows stays a well-formed event."""
        if isinstance(err, _MaxDuration):  # max_stream_sec: latgate's own limit
            failure = self._fail("stream_max_duration", f"{self.max_stream_seconds:g} s", status=504)
        else:
            failure = self._fail("stream_" + err.kind, str(err))
        held = self.tap.release_held()
        if held:
            await send({"type": "http.response.body", "body": held, "more_body": True})
        return failure

    def _observe_itl(self) -> None:
        """Inter-token latency per token, as vLLM and the OpenTelemetry GenAI "time per
        output token" define it: a read can carry several tokens (an engine under load
        batches them into one chunk), so each gap between reads with content is divided
        among the tokens it brought. With usage's completion tokens ``N`` over ``R``
        reads, the tokens after the first read (``N - round(N / R)``, at most ``N - 1``)
        are spread evenly over the ``R - 1`` gaps; one per gap without usage."""
        gaps = self._gaps
        if not gaps:
            return
        usage = self.tap.usage
        completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
        samples = len(gaps)
        if isinstance(completion, int) and completion > len(gaps) + 1:
            samples = min(completion - 1, completion - round(completion / (len(gaps) + 1)))
        base, extra = divmod(samples, len(gaps))
        ex = self.exchange
        itl = self.recorder.metrics.itl_batch(provider=ex.provider, model=ex.public_model)
        for index, gap in enumerate(gaps):
            tokens = base + (1 if index < extra else 0)
            itl.observe_many(gap / tokens, tokens)
        itl.flush()

    async def _end_cut(self, send: Send) -> None:
        """The end of a stream cut at the drain deadline: an error event (or the
        transform's error ending), then the end of the response."""
        message = "latgate is shutting down: the drain timeout cut this stream; the response is incomplete"
        if self.transform is not None:
            await _transforming(send, self.transform)({"type": "latgate.finish", "error": message})
        else:
            event = error_event(message, code="drain_timeout")
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _fail(self, kind: str, detail: str, *, status: int = 502) -> str:
        """Record a mid-stream failure (``status`` for the access log); returns the
        message for the client."""
        ex = self.exchange
        ex.error_kind = kind
        ex.status = status
        if kind == "stream_max_duration":  # the stream's own bound: nothing the upstream did
            return f"the stream reached max_stream_sec ({detail}); the response is incomplete"
        if kind != "stream_too_large":  # latgate's own limit: not the upstream's failure
            self.on_upstream_failure(kind)
        self.recorder.metrics.record_upstream_error(provider=ex.provider, kind=kind)
        return f"provider {ex.provider!r} failed mid-stream ({detail}); the response is incomplete"

    def _first_token(self, now: float) -> None:
        ex = self.exchange
        ex.first_token_at = ex.last_token_at = now
        self.recorder.metrics.record_ttft(provider=ex.provider, model=ex.public_model, seconds=now - ex.received_at)


def watch_disconnect(receive: Receive, on_disconnect: Callable[[], None]) -> asyncio.Task[None]:
    """A task that calls ``on_disconnect()`` when the client's ``http.disconnect``
    arrives on ``receive`` (after the request body was read, ASGI ``receive`` carries
    nothing else); cancel it when done."""

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        on_disconnect()

    return asyncio.create_task(watch())


def _transforming(send: Send, transform: ResponseTransform) -> Send:
    """``send`` with body bytes converted by ``transform``; ``latgate.finish`` messages
    send the transform's closing bytes."""

    async def transformed(message: Message) -> None:
        if message["type"] == "latgate.finish":
            body = transform.finish(error=message["error"])
        else:
            body = transform.feed(message["body"])
        if body:
            await send({"type": "http.response.body", "body": body, "more_body": True})

    return transformed


async def _nothing() -> AsyncIterator[bytes]:
    """An empty body: the head already held the whole stream."""
    empty: tuple[bytes, ...] = ()
    for chunk in empty:
        yield chunk
