"""One attempt of a routed request at one endpoint: what it is (:class:`Attempt`) and
how it is sent and read up to its first generated content (:class:`AttemptSender`).

An attempt that fails before anything reached the client raises
:class:`~latgate.forwarding.failures.AttemptFailed` (recorded once, against the endpoint's
health where it is the upstream's failure); the forwarder (:mod:`latgate.forwarding.forward`)
then asks :mod:`latgate.routing` where the next one goes. A stream's attempt holds
the upstream's events until the first one carrying generated content (or the stream's
end), under the attempt's first-token deadline, then hands the rest to a
:class:`~latgate.forwarding.relay.StreamRelay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import orjson

from latgate.forwarding.answer import Answer
from latgate.forwarding.exchange import Exchange
from latgate.forwarding.failures import NO_FIRST_TOKEN, Failures, aborted_answer, provider_secrets
from latgate.forwarding.hedge import LostRace, Race
from latgate.forwarding.keepalive import EarlyHead
from latgate.forwarding.recorder import Recorder
from latgate.forwarding.redact import scrub_key_echoes
from latgate.forwarding.relay import StreamRelay, max_stream_seconds
from latgate.forwarding.sse import StreamTap
from latgate.forwarding.stream_start import StreamStart
from latgate.forwarding.transform import ResponseTransform, UntranslatableAnswer
from latgate.forwarding.usage import answer_tokens
from latgate.forwarding.wire import (
    client_headers,
    model_rewrite,
    refuses_stream_options,
    sends_own_stream_options,
    tap_drop,
)
from latgate.foundation.config.schema import Config
from latgate.foundation.metrics import Metrics
from latgate.live.providers import EndpointRuntime, ProviderPool, ProviderRuntime, Ticket
from latgate.routing.plan import RoutePlan
from latgate.routing.selection import Selector
from latgate.routing.targets import RouteDecision, Target
from latgate.transport.prelude import KeepalivePrelude
from latgate.transport.upstream import (
    UpstreamClient,
    UpstreamFailure,
    UpstreamResponse,
    read_at_most,
    upstream_errors,
    upstream_headers,
)


@dataclass(frozen=True, slots=True)
class Routed:
    """A routed request being forwarded: what every attempt of it shares.

    Attributes:
        exchange: the request's record (where it went, timings, outcome).
        decision: the router's decision (candidates, budget, flags).
        plan: the selector's plan (provider order, first endpoint, hedge).
        body: the client's parsed request body.
        path: the upstream path (``/chat/completions``, ``/completions``...).
        transform: converts the answer into another API's wire format, or None.
        early: a stream whose head may go out before content, with keep-alives
            (:mod:`latgate.forwarding.keepalive`): what its attempts share with that stream;
            None otherwise.
    """

    exchange: Exchange
    decision: RouteDecision
    plan: RoutePlan
    body: dict[str, Any]
    path: str
    transform: ResponseTransform | None
    early: EarlyHead | None = None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of a routed request at one endpoint.

    Attributes:
        routed: the request.
        target: the provider and upstream model tried, with the route reason.
        provider / endpoint: where it goes.
        payload: the JSON bytes sent (the body as this provider takes it).
        last: nothing is left to try after it (its first-token deadline is then the
            configured one alone: giving up helps nobody).
        race: the hedge race it runs in, or None.
        stream_options_refused: the request sent again without ``stream_options``
            after this endpoint refused them; taken, it is evidence that the field was
            the problem (:mod:`latgate.live.providers.stream_options`).
    """

    routed: Routed
    target: Target
    provider: ProviderRuntime
    endpoint: EndpointRuntime
    payload: bytes
    last: bool = False
    race: Race | None = None
    stream_options_refused: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptSender:
    """Sends attempts and reads each up to its answer or its first generated content.

    Attributes:
        config: the resolved config (limits, timeouts).
        pool: the providers and their endpoints (in flight, outcomes, first tokens).
        client: the pooled upstream client.
        metrics: where overhead and retries are counted.
        recorder: where a finished request goes (the app's).
        failures: records failed attempts and builds their errors.
        selector: the routing strategy (each attempt's first-token deadline).
    """

    config: Config
    pool: ProviderPool
    client: UpstreamClient
    metrics: Metrics
    recorder: Recorder
    failures: Failures
    selector: Selector

    # long: one attempt's steps in order (tap, ticket, open, status, answer or stream): its locals are the attempt's state
    async def send(self, attempt: Attempt) -> Answer | StreamRelay:
        """Send ``attempt`` and return the client's response: an :class:`Answer`, or for
        a stream a :class:`StreamRelay` holding everything up to the first content.

        Raises:
            AttemptFailed: it failed before anything reached the client (a stream's
                ``stream_options`` refused: ``stream_options_refused`` names the
                provider, for the forwarder to send it again without them).
            LostRace: in a hedge race, the other attempt got content first.
        """
        routed, provider, endpoint, target = attempt.routed, attempt.provider, attempt.endpoint, attempt.target
        exchange, plan = routed.exchange, routed.plan
        exchange.provider, exchange.endpoint = provider.name, endpoint.config.id
        exchange.upstream_model, exchange.reason = target.model, target.reason
        exchange.attempts += 1
        body = routed.body
        tap = None
        if exchange.stream:
            tap = StreamTap(
                drop_usage_chunk=tap_drop(body),
                model_rewrite=model_rewrite(body, target),
                max_event_bytes=self.config.defaults.max_event_bytes,
                text_error=provider.connector.text_error,
                secrets=provider_secrets(provider),
            )
        stack = contextlib.AsyncExitStack()
        if plan.reserved and endpoint is plan.endpoint:  # counted in flight from here on
            plan.reserved = False
            self.pool.release(endpoint)
        queue_ms = endpoint.queue_ms(self.pool.clock())  # before this attempt counts in flight
        predicted_ms = queue_ms + endpoint.predictor.predict_ms(plan.prompt_tokens)
        ticket = self.pool.begin(provider, endpoint, prompt_tokens=plan.prompt_tokens, queue_ms=queue_ms, prefix=plan.prompt_prefix, completion_tokens=plan.completion_tokens)  # fmt: skip
        stack.callback(self.pool.end, provider, endpoint, ticket)
        handed_off = False
        try:
            headers = upstream_headers(auth=provider.auth_headers, request_id=exchange.request_id, stream=exchange.stream)
            if exchange.trace_headers is not None:  # W3C traceparent: the request's span is the parent
                headers.update(exchange.trace_headers)
            url = provider.connector.url(endpoint.config, routed.path)
            if exchange.attempts == 1:
                self.metrics.record_overhead(time.perf_counter() - exchange.received_at)
            deadline = None
            whole_by = None  # a non-streamed answer: whole within timeout_sec of sending (docs/configuration.md)
            if tap is None:  # no first-token deadline: its first byte comes once it is all generated
                whole_by = asyncio.get_running_loop().time() + self._timeout_seconds(provider)
            else:
                deadline_ms = self.selector.deadline_ms(plan, predicted_ttft_ms=predicted_ms, last_attempt=attempt.last)
                if deadline_ms:
                    deadline = asyncio.get_running_loop().time() + deadline_ms / 1000.0
                    ticket.budget_deadline = deadline_ms != self.selector.configured_deadline_ms
            try:
                async with asyncio.timeout_at(deadline):
                    response = await self.client.open(
                        url=url, payload=attempt.payload, headers=headers, read_timeout_seconds=provider.config.timeout_sec,
                        egress=provider.egress, group=provider.name,
                        max_connections=provider.config.max_connections or self.config.defaults.max_connections,
                        max_decoded_bytes=self.config.defaults.max_response_bytes,
                    )  # fmt: skip
            except TimeoutError:
                ticket.censored = True
                raise self.failures.failed(provider, endpoint, NO_FIRST_TOKEN, health=not ticket.budget_deadline) from None
            except UpstreamFailure as failure:
                raise self.failures.failed(provider, endpoint, failure) from None
            stack.push_async_callback(response.aclose)
            if response.status_code != 200:
                failed = await self.failures.status_failure(provider, endpoint, response, deadline, url=url)
                if tap is not None and not attempt.stream_options_refused and refuses_stream_options(failed.error, attempt.payload):
                    failed.stream_options_refused = provider.name  # once: sent again without them
                raise failed
            if tap is not None and provider.stream_options.refusals and b'"stream_options":' in attempt.payload:
                provider.stream_options.accepted()  # taken again after a refusal
            if tap is None:
                assert whole_by is not None
                return await self._complete(attempt, response, ticket, whole_by=whole_by)
            relay = await self._start_stream(attempt, response, tap, stack, deadline, ticket)
            handed_off = True
            if attempt.stream_options_refused and sends_own_stream_options(body, routed.path):
                provider.stream_options.refused(time.monotonic())  # taken without them: the field was the problem
            return relay
        except asyncio.CancelledError:
            ticket.censored = True  # lost a hedge race, or the client left, before a first token
            raise
        finally:
            if not handed_off:
                await stack.aclose()

    # long: one loop under the first-token deadline (per-chunk work) whose locals the relay takes over
    async def _start_stream(
        self,
        attempt: Attempt,
        response: UpstreamResponse,
        tap: StreamTap,
        stack: contextlib.AsyncExitStack,
        deadline: float | None,
        ticket: Ticket,
    ) -> StreamRelay:
        """Read up to the first generated content (under the first-token deadline), then
        hand the rest to a :class:`StreamRelay`. In a hedge race, only the first attempt
        to get there goes on (the other raises :class:`LostRace`)."""
        provider, endpoint, exchange = attempt.provider, attempt.endpoint, attempt.routed.exchange
        content_type = response.headers.get("content-type", "")
        body = response.aiter_raw()
        if content_type.startswith("application/json"):  # the stream flag ignored, or an error object
            raise await self.failures.not_event_stream(provider, endpoint, "a JSON body", b"", body, deadline)
        if content_type.startswith("text/html"):  # a login page, a proxy's notice
            raise await self.failures.wrong_content_type(provider, endpoint, content_type, deadline)
        early = attempt.routed.early
        start = StreamStart()  # what comes before the first content must be SSE
        not_sse: bytes | None = None
        head: list[bytes] = []
        held = 0
        units = 0
        ended = False
        try:
            async with asyncio.timeout_at(deadline):
                with upstream_errors():
                    while True:
                        try:
                            data = await anext(body)
                        except StopAsyncIteration:
                            ended = True
                            break
                        out, units = tap.feed(data)
                        offset = -1 if units else start.feed(data)  # a read with content speaks SSE
                        if offset >= 0:
                            not_sse = data[offset:]
                            break
                        if out and early is not None and not units:  # the head went out: comments go on now
                            out = early.hold(out, tap.separator)
                        if out:
                            head.append(out)
                            held += len(out)
                            if held > self.config.defaults.max_event_bytes and not units:  # events without content: not kept unbounded
                                raise UpstreamFailure("too_large", "the events before the first token exceeded max_event_bytes")
                        if tap.error is not None or units or tap.done:
                            break
        except TimeoutError:
            ticket.censored = True
            raise self.failures.failed(provider, endpoint, NO_FIRST_TOKEN, health=not ticket.budget_deadline) from None
        except UpstreamFailure as failure:
            raise self.failures.failed(provider, endpoint, failure) from None
        if not_sse is not None:  # nothing of it reached the client
            raise await self.failures.not_event_stream(provider, endpoint, start.what, not_sse, body, deadline)
        if tap.error is not None:
            raise self.failures.error_event(provider, endpoint, tap.error, error_kind=tap.error_kind)
        if tap.aborted and not units:
            raise self.failures.bad_response(provider, endpoint, "aborted the stream before any content")
        if ended and not units and not tap.done and not tap.finished:
            empty = UpstreamFailure("read", "the stream ended before any content")
            raise self.failures.failed(provider, endpoint, empty)
        if units:
            self.pool.record_first_token(provider, endpoint, ticket, ttft_ms=(time.perf_counter() - ticket.started_at) * 1000.0)
        self.pool.record_outcome(provider, endpoint, ok=True, ticket=ticket)
        if attempt.race is not None:
            if not attempt.race.claim():
                raise LostRace()
            exchange.provider, exchange.endpoint = provider.name, endpoint.config.id
            exchange.upstream_model, exchange.reason = attempt.target.model, attempt.target.reason
            exchange.fallback_model = attempt.target.fallback_model
        stack.callback(self._record_decode, provider, endpoint, exchange, tap, ticket)
        handed = stack.pop_all()
        transform = attempt.routed.transform
        content_type = content_type if transform is None else transform.stream_content_type
        return StreamRelay(
            headers=client_headers(exchange, content_type),
            head=b"".join(head),
            head_units=units,
            body=body,
            tap=tap,
            exchange=exchange,
            recorder=self.recorder,
            on_close=handed.aclose,
            on_upstream_failure=lambda kind: self.pool.record_outcome(provider, endpoint, ok=False),
            transform=transform,
            secrets=provider_secrets(provider),
            max_stream_seconds=max_stream_seconds(self.config, attempt.routed.decision.policy, provider.name),
            quiet_seconds=self._timeout_seconds(provider),
        )

    async def _complete(self, attempt: Attempt, response: UpstreamResponse, ticket: Ticket, *, whole_by: float) -> Answer:
        """A non-streamed answer, read whole by ``whole_by`` (an event-loop time:
        ``timeout_sec`` after sending). No first-token deadline applies: an engine writes
        a non-streamed answer only once the whole completion is generated, so one would
        cut, and re-run elsewhere, every long generation. Keep-alive whitespace and ``:``
        comment lines before a chunked answer are skipped
        (:class:`~latgate.transport.prelude.KeepalivePrelude`). The key's echoes redacted,
        its usage taken, the model name rewritten. An event stream (``stream: false``
        ignored) or an HTML page is refused unread, as the provider's failure."""
        provider, endpoint, exchange = attempt.provider, attempt.endpoint, attempt.routed.exchange
        content_type = response.headers.get("content-type", "")
        if content_type.startswith(("text/html", "text/event-stream")):  # a page, or a stream nobody asked for
            raise await self.failures.wrong_content_type(provider, endpoint, content_type, None)
        # keep-alives come before an answer whose length was not known when its head was sent
        prelude = None if "content-length" in response.headers else KeepalivePrelude()
        try:
            async with asyncio.timeout_at(whole_by):
                with upstream_errors():
                    data = await read_at_most(response, self.config.defaults.max_response_bytes, prelude=prelude)
        except TimeoutError:
            missed = self._late_answer(provider, keepalives_only=prelude is not None and not prelude.found and prelude.seen > 0)
            raise self.failures.failed(provider, endpoint, missed) from None
        except UpstreamFailure as failure:
            raise self.failures.failed(provider, endpoint, failure) from None
        data = scrub_key_echoes(data, provider_secrets(provider))  # the provider's key, should it be echoed
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):  # an event stream, a proxy's page, a truncated body: never relayed
            raise self.failures.bad_response(provider, endpoint, "answered a non-streamed request with a body that is not a JSON object")
        if parsed.get("error") is not None and "choices" not in parsed and "data" not in parsed:
            self.pool.record_outcome(provider, endpoint, ok=True, ticket=ticket)
            error = parsed["error"]  # an OpenAI error object, or a bare string (TileRT's)
            raise self.failures.error_event(provider, endpoint, error if isinstance(error, dict) else {"message": str(error)})
        if aborted_answer(parsed):  # nothing reached the client yet: retried like any failure before the first byte
            raise self.failures.bad_response(provider, endpoint, "ended its answer with finish_reason 'abort'")
        if not exchange.apply_usage(parsed.get("usage")):  # absent or malformed: latgate's own count
            exchange.usage_estimated = True
            exchange.completion_tokens = answer_tokens(parsed)
        elif exchange.cached_prompt_tokens is not None:
            self.pool.record_cached_tokens(
                provider, endpoint, ticket, cached_tokens=exchange.cached_prompt_tokens, prompt_tokens=exchange.prompt_tokens
            )
        if exchange.upstream_model != exchange.public_model and parsed.get("model") == exchange.upstream_model:
            parsed["model"] = exchange.public_model
            data = orjson.dumps(parsed)
        transform = attempt.routed.transform
        if transform is not None:
            try:
                data = transform.complete(data)
            except UntranslatableAnswer as odd:  # e.g. no choice: never an empty success
                raise self.failures.bad_response(provider, endpoint, f"answered with {odd}") from None
        self.pool.record_outcome(provider, endpoint, ok=True, ticket=ticket)
        exchange.status = 200
        headers = client_headers(exchange, response.headers.get("content-type", "application/json"))
        # Finished once the body was handed to the server (e2e includes writing it).
        return Answer(body=data, headers=headers, on_sent=lambda: self.recorder.finish(exchange))

    def _record_decode(
        self, provider: ProviderRuntime, endpoint: EndpointRuntime, exchange: Exchange, tap: StreamTap, ticket: Ticket
    ) -> None:
        """After a stream: its time per output token (usage's completion tokens, else the
        chunks with content), for the endpoint's live numbers; the prompt tokens its
        usage says the engine served from its prefix cache (the relay applied the
        stream's usage chunk to the exchange before this)."""
        if not exchange.usage_estimated and exchange.cached_prompt_tokens is not None:
            self.pool.record_cached_tokens(
                provider, endpoint, ticket, cached_tokens=exchange.cached_prompt_tokens, prompt_tokens=exchange.prompt_tokens
            )
        if exchange.first_token_at is not None and exchange.last_token_at is not None:
            seconds = exchange.last_token_at - exchange.first_token_at
            usage = tap.usage.get("completion_tokens") if isinstance(tap.usage, dict) else None
            tokens = usage if isinstance(usage, int) and usage >= tap.content_chunks else tap.content_chunks
            self.pool.record_decode(
                endpoint, tokens=tokens, seconds=seconds, priority=exchange.priority, tenant=exchange.tenant
            )

    def _timeout_seconds(self, provider: ProviderRuntime) -> float:
        """The provider's ``timeout_sec`` (else ``[defaults]``'s): the longest upstream
        silence, and the whole of a non-streamed answer."""
        return provider.config.timeout_sec or self.config.defaults.timeout_sec

    def _late_answer(self, provider: ProviderRuntime, *, keepalives_only: bool = False) -> UpstreamFailure:
        """The failure of a non-streamed answer not whole within :meth:`_timeout_seconds`
        (``keepalives_only``: only keep-alives came)."""
        what = "only keep-alives, no answer" if keepalives_only else "no whole answer"
        return UpstreamFailure("timeout", f"{what} within timeout_sec ({self._timeout_seconds(provider):g} s)")
