"""Sending a routed request upstream: retries on the same provider, then the fallback
order, and only ever before the first byte reached the client.

For streams, latgate reads the upstream until the first event carrying generated
content (or the end of the stream) *before* answering the client: the role-only chunk
carries nothing a client can show, and holding it costs nothing in time to first
token, but it means an upstream that fails, stalls past ``first_token_timeout_sec`` or
answers a 200 whose first event is an error object can still be retried or failed over.

A latency-sensitive request whose pool refuses rather than queues (TileRT) may first be
held for a free slot while its budget allows (:mod:`latgate.routing.admission`).
Where each attempt goes is the :class:`~latgate.routing.selection.Selector`'s plan
(``routing.strategy``): the provider order (an overflow first, reason
``overflow:FROM``), the endpoint, and under strategy ``latgate`` a first-token deadline
from the request's budget (see :mod:`latgate.routing.policies.deadline`) and, when the
route policy asks for it, a hedge: a second copy sent when the first token is late,
the first to produce content forwarded and the other cancelled (:mod:`.hedge`).

A provider that answers that it is full (TileRT's busy 429) is not retried: the request
goes on at once to the next candidate (reason ``overflow:FROM``, counted in
``latgate_overflows_total``), with no back-off and nothing against the provider's health.

Which failures are retried, and how each becomes the client's error, is
:mod:`latgate.proxy.failures`. One is retried on the same endpoint at once, whatever
``max_retries`` says: a stream's ``stream_options`` refused with a 400 (or 422) naming
them, sent again without them; the provider is remembered as rejecting them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import orjson

from latgate.api.largebody import is_large
from latgate.config.schema import Config
from latgate.errors import ContextLengthExceeded, GatewayError, UpstreamUnavailable
from latgate.metrics import Metrics
from latgate.providers import EndpointRuntime, ProviderPool, ProviderRuntime, Ticket
from latgate.providers.catalog import context_tokens, fits, window_refusal
from latgate.proxy.answer import Answer
from latgate.proxy.exchange import Exchange
from latgate.proxy.failures import (
    NO_FIRST_TOKEN,
    PROVIDER_AUTH_STATUSES,
    RETRYABLE_STATUSES,
    AttemptFailed,
    Failures,
    aborted_answer,
    provider_secrets,
)
from latgate.proxy.hedge import LostRace, Race, run_hedged
from latgate.proxy.keepalive import EarlyHead, EarlyStream, keepalive_seconds, wait_briefly
from latgate.proxy.relay import StreamRelay
from latgate.proxy.sse import StreamTap
from latgate.proxy.transform import ResponseTransform
from latgate.proxy.upstream import (
    UpstreamClient,
    UpstreamFailure,
    read_at_most,
    upstream_errors,
    upstream_headers,
)
from latgate.proxy.wire import (
    client_headers,
    model_rewrite,
    rejects_stream_options,
    tap_drop,
    upstream_payload,
)
from latgate.routing.admission import Admission, overflow_targets
from latgate.routing.decision import RouteDecision, Target
from latgate.routing.plan import RoutePlan
from latgate.routing.selection import Selector

BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 1.0
MAX_RETRY_AFTER_SECONDS = 5.0


class Forwarder:
    """Owns the send -> retry -> fallback loop for every request.

    Args:
        config: the resolved config (timeouts, retries).
        pool: providers' run-time state.
        client: the pooled upstream client.
        metrics: where retries, fallbacks and errors are counted.
        sleep: awaited between retries (injectable for tests).
        selector: the routing strategy over live state (one for ``config`` and
            ``pool`` by default).
    """

    def __init__(
        self,
        *,
        config: Config,
        pool: ProviderPool,
        client: UpstreamClient,
        metrics: Metrics,
        sleep: Callable[[float], Any] = asyncio.sleep,
        selector: Selector | None = None,
    ) -> None:
        self._config = config
        self._pool = pool
        self._client = client
        self._metrics = metrics
        self._failures = Failures(pool=pool, metrics=metrics)
        self._sleep = sleep
        self.selector = selector or Selector(config=config, pool=pool)
        self.admission = Admission(
            pool=pool, metrics=metrics, enabled=config.routing.admission and self.selector.strategy == "latgate"
        )

    async def forward(
        self,
        *,
        exchange: Exchange,
        decision: RouteDecision,
        body: dict[str, Any],
        path: str,
        transform: ResponseTransform | None = None,
    ) -> Any:
        """Send ``body`` to ``path`` (``/chat/completions``...) of the decision's candidates.

        ``transform`` converts the answer into another API's wire format (see
        :mod:`latgate.proxy.transform`); without it the answer passes through.

        Returns:
            an ASGI response: a :class:`StreamRelay` for streams, else an :class:`Answer`;
            an :class:`~latgate.proxy.keepalive.EarlyStream` for a stream still without
            content after its ``first_token_keepalive_sec`` (the attempts go on in it).

        Raises:
            GatewayError: every candidate failed; the last failure (its upstream status
                and error envelope where there was one).
        """
        interval = keepalive_seconds(self._config, decision) if exchange.stream else 0.0
        if not interval:
            return await self._planned(exchange, decision, body, path, transform)
        early = exchange.early = EarlyHead()
        attempts = asyncio.create_task(self._planned(exchange, decision, body, path, transform))
        await wait_briefly(attempts, interval)
        if attempts.done():
            return attempts.result()
        return EarlyStream(
            attempts=attempts, early=early, exchange=exchange, metrics=self._metrics, interval_seconds=interval, transform=transform
        )

    async def _planned(
        self, exchange: Exchange, decision: RouteDecision, body: dict[str, Any], path: str, transform: ResponseTransform | None
    ) -> Any:
        decision = await self.admission.hold(decision, explain=exchange.extra if decision.explain else None)
        plan = self.selector.plan(decision, body)  # at once: a slot admission held for it is free for it
        try:
            return await self._forward(exchange, decision, plan, body, path, transform)
        finally:
            if plan.reserved:  # no attempt started (a bad body, a cancelled request)
                self._pool.release(plan.endpoint)

    async def _forward(
        self,
        exchange: Exchange,
        decision: RouteDecision,
        plan: RoutePlan,
        body: dict[str, Any],
        path: str,
        transform: ResponseTransform | None,
    ) -> Any:
        if plan.overflow_from is not None:
            self._metrics.record_overflow(from_provider=plan.overflow_from, to_provider=plan.targets[0].provider)
        if decision.explain:
            exchange.extra["route_candidates"] = plan.explain_header()
        model = self._config.models.get(exchange.public_model)
        limit = model.max_context_tokens if model is not None else None
        if limit is not None and plan.prompt_tokens > limit:
            raise ContextLengthExceeded(window_refusal(exchange.public_model, plan.prompt_tokens, limit, []), param="messages")
        max_retries = self._config.defaults.max_retries
        last: GatewayError = UpstreamUnavailable("no provider could take the request")
        previous: str | None = None
        busy_from: str | None = None
        tried: list[EndpointRuntime] = []
        refused: list[tuple[str, int]] = []  # providers none of whose endpoints' windows fit the prompt
        targets = list(plan.targets)
        position = -1
        while position + 1 < len(targets):
            position += 1
            target = targets[position]
            provider = self._pool[target.provider]
            small = [ep for ep in provider.endpoints if not fits(ep.catalog, target.model, plan.prompt_tokens)]
            if len(small) == len(provider.endpoints):
                refused.append((provider.name, min(context_tokens(ep.catalog, target.model) or 0 for ep in small)))
                continue
            if busy_from is not None:
                self._metrics.record_overflow(from_provider=busy_from, to_provider=target.provider)
                busy_from = None
            elif previous is not None:
                self._metrics.record_fallback(from_provider=previous, to_provider=target.provider)
            previous = target.provider
            if is_large(body):  # encoded in slices off the event loop (latgate.api.largebody)
                payload = await asyncio.to_thread(upstream_payload, body, target, provider, stream=exchange.stream, path=path)
            else:
                payload = upstream_payload(body, target, provider, stream=exchange.stream, path=path)
            exchange.extra["fallback_model"] = target.fallback_model
            for attempt in range(max_retries + 1):
                if attempt:
                    self._metrics.record_retry(provider=provider.name)
                endpoint = plan.endpoint
                if tried or endpoint in small:
                    endpoint = self.selector.next_endpoint(provider, plan, exclude=tried + small)
                    if endpoint in small:
                        break  # the endpoints whose window fits are all tried or unavailable
                tried.append(endpoint)
                # Only another endpoint or provider is worth giving up on this one for:
                # a retry would go back to the same endpoint once every one is tried.
                untried = attempt < max_retries and any(other not in tried for other in provider.endpoints)
                last_attempt = position == len(targets) - 1 and not untried
                try:
                    if plan.hedge is not None and exchange.stream and len(tried) == 1:
                        return await self._hedged(exchange, decision, plan, target, provider, endpoint, payload, body, path, transform)
                    return await self._attempt(
                        exchange, decision, plan, target, provider, endpoint, payload, body, path, transform, last_attempt=last_attempt
                    )
                except AttemptFailed as failed:
                    last = failed.error
                    if failed.busy:  # full, not failing: the next candidate at once, no retry here
                        busy_from = provider.name
                        targets[position + 1 :] = overflow_targets(targets[position + 1 :], decision, busy_from)
                        break
                    if not failed.retryable or attempt == max_retries:
                        break
                    delay = failed.retry_after
                    if delay is None:
                        delay = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * (2**attempt))
                    elif delay > MAX_RETRY_AFTER_SECONDS:
                        break  # the provider asks for a long pause: move on to the fallbacks
                    await self._sleep(delay)
            if isinstance(last, GatewayError) and last.status < 500 and last.status not in RETRYABLE_STATUSES | PROVIDER_AUTH_STATUSES:
                break  # the client's own mistake: another provider would say the same
        if refused and not tried:
            raise ContextLengthExceeded(window_refusal(exchange.public_model, plan.prompt_tokens, None, refused), param="messages")
        if plan.cause is not None:
            last.message = f"{last.message}; {plan.cause}"
            last.cause = plan.cause if last.cause is None else f"{last.cause}; {plan.cause}"
        raise last

    async def _hedged(
        self,
        exchange: Exchange,
        decision: RouteDecision,
        plan: RoutePlan,
        target: Target,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        payload: bytes,
        body: dict[str, Any],
        path: str,
        transform: ResponseTransform | None,
    ) -> Any:
        """The first attempt, and the plan's hedge if no first token came by its delay."""
        hedge = plan.hedge
        assert hedge is not None
        race = Race()

        def first() -> Any:
            return self._attempt(
                exchange, decision, plan, target, provider, endpoint, payload, body, path, transform, last_attempt=False, race=race
            )

        sent: list[str] = []

        def second() -> Any:
            now = self.selector.hedge_target(plan)  # chosen now: load moved since the plan
            if now is None:
                return None
            runtime = self._pool[now.target.provider]
            self._metrics.record_hedge(provider=runtime.name)
            sent.append(runtime.name)
            copy = payload if now.target == target else upstream_payload(body, now.target, runtime, stream=True, path=path)
            return self._attempt(
                exchange, decision, plan, now.target, runtime, now.endpoint, copy, body, path, transform, last_attempt=False, race=race
            )

        response, hedge_won = await run_hedged(first, second, delay_seconds=hedge.delay_ms / 1000.0)
        if hedge_won:
            self._metrics.record_hedge_win(provider=sent[0])
        return response

    async def _attempt(
        self,
        exchange: Exchange,
        decision: RouteDecision,
        plan: RoutePlan,
        target: Target,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        payload: bytes,
        body: dict[str, Any],
        path: str,
        transform: ResponseTransform | None,
        *,
        last_attempt: bool,
        race: Race | None = None,
    ) -> Any:
        exchange.provider, exchange.endpoint = provider.name, endpoint.config.id
        exchange.upstream_model, exchange.reason = target.model, target.reason
        exchange.attempts += 1
        limit = self._config.defaults.max_event_bytes
        text_error = provider.connector.text_error
        tap = (
            StreamTap(drop_usage_chunk=tap_drop(body), model_rewrite=model_rewrite(body, target), max_event_bytes=limit, text_error=text_error)
            if exchange.stream
            else None
        )
        stack = contextlib.AsyncExitStack()
        if plan.reserved and endpoint is plan.endpoint:  # counted in flight from here on
            plan.reserved = False
            self._pool.release(endpoint)
        queue_ms = endpoint.queue_ms(self._pool.clock())  # before this attempt counts in flight
        predicted_ms = queue_ms + endpoint.predictor.predict_ms(plan.prompt_tokens)
        ticket = self._pool.begin(provider, endpoint, prompt_tokens=plan.prompt_tokens, queue_ms=queue_ms)
        stack.callback(self._pool.end, provider, endpoint, ticket)
        handed_off = False
        try:
            headers = upstream_headers(auth=provider.auth_headers, request_id=exchange.request_id, stream=exchange.stream)
            if exchange.trace is not None:  # W3C traceparent: the request's span is the parent
                headers.update(exchange.trace.upstream_headers())
            url = provider.connector.url(endpoint.config, path)
            read_timeout = provider.config.timeout_sec
            if exchange.attempts == 1:
                self._metrics.record_overhead(time.perf_counter() - exchange.received_at)
            deadline = None
            if tap is not None:
                deadline_ms = self.selector.deadline_ms(plan, predicted_ttft_ms=predicted_ms, last_attempt=last_attempt)
                if deadline_ms:
                    deadline = asyncio.get_running_loop().time() + deadline_ms / 1000.0
                    ticket.budget_deadline = deadline_ms != self.selector.configured_deadline_ms
            try:
                async with asyncio.timeout_at(deadline):
                    response = await self._client.open(
                        url=url, payload=payload, headers=headers, read_timeout_seconds=read_timeout, egress=provider.egress,
                        group=provider.name, max_connections=provider.config.max_connections or self._config.defaults.max_connections,
                    )  # fmt: skip
            except TimeoutError:
                ticket.censored = True
                raise self._failures.failed(provider, endpoint, NO_FIRST_TOKEN, health=not ticket.budget_deadline) from None
            except UpstreamFailure as failure:
                raise self._failures.failed(provider, endpoint, failure) from None
            stack.push_async_callback(response.aclose)
            if response.status_code != 200:
                failed = await self._failures.status_failure(provider, endpoint, response, deadline)
                if tap is not None and rejects_stream_options(failed.error, provider, payload):
                    provider.rejects_stream_options = True  # remembered: never sent to it again
                    self._metrics.record_retry(provider=provider.name)
                    await stack.aclose()
                    again = upstream_payload(body, target, provider, stream=True, path=path)
                    return await self._attempt(
                        exchange, decision, plan, target, provider, endpoint, again, body, path, transform, last_attempt=last_attempt, race=race
                    )
                raise failed
            if tap is None:
                return await self._complete(exchange, provider, endpoint, response, transform, ticket=ticket)
            relay = await self._start_stream(
                exchange, provider, endpoint, response, tap, stack, deadline, transform, ticket=ticket, race=race, winner=(decision, target)
            )
            handed_off = True
            return relay
        except asyncio.CancelledError:
            ticket.censored = True  # lost a hedge race, or the client left, before a first token
            raise
        finally:
            if not handed_off:
                await stack.aclose()

    async def _start_stream(
        self,
        exchange: Exchange,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        response: Any,
        tap: StreamTap,
        stack: contextlib.AsyncExitStack,
        deadline: float | None,
        transform: ResponseTransform | None,
        *,
        ticket: Ticket,
        race: Race | None,
        winner: tuple[RouteDecision, Target],
    ) -> StreamRelay:
        """Read up to the first generated content (under the first-token deadline), then
        hand the rest to a :class:`StreamRelay`. In a hedge race, only the first attempt
        to get there goes on (the other raises :class:`LostRace`)."""
        content_type = response.headers.get("content-type", "")
        if content_type.startswith(("text/html", "application/json")):  # a page, or the stream flag ignored
            raise await self._failures.wrong_content_type(provider, endpoint, content_type, deadline)
        body = response.aiter_raw()
        early = exchange.early
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
                        if out and early is not None and not units:  # the head went out: comments go on now
                            out = early.hold(out, tap.separator)
                        if out:
                            head.append(out)
                            held += len(out)
                            if held > self._config.defaults.max_event_bytes and not units:  # events without content: not kept unbounded
                                raise UpstreamFailure("too_large", "the events before the first token exceeded max_event_bytes")
                        if tap.error is not None or units or tap.done:
                            break
        except TimeoutError:
            ticket.censored = True
            raise self._failures.failed(provider, endpoint, NO_FIRST_TOKEN, health=not ticket.budget_deadline) from None
        except UpstreamFailure as failure:
            raise self._failures.failed(provider, endpoint, failure) from None
        if tap.error is not None:
            raise self._failures.error_event(provider, endpoint, tap.error, error_kind=tap.error_kind)
        if tap.aborted and not units:
            raise self._failures.bad_response(provider, endpoint, "aborted the stream before any content")
        if ended and not units and not tap.done and not tap.finished:
            failure = UpstreamFailure("read", "the stream ended before any content")
            raise self._failures.failed(provider, endpoint, failure)
        if units:
            self._pool.record_first_token(provider, endpoint, ticket, ttft_ms=(time.perf_counter() - ticket.started_at) * 1000.0)
        self._pool.record_outcome(provider, endpoint, ok=True, ticket=ticket)
        if race is not None:
            if not race.claim():
                raise LostRace()
            _, target = winner
            exchange.provider, exchange.endpoint = provider.name, endpoint.config.id
            exchange.upstream_model, exchange.reason = target.model, target.reason
            exchange.extra["fallback_model"] = target.fallback_model
        stack.callback(self._record_decode, endpoint, exchange, tap)
        handed = stack.pop_all()
        if transform is not None:
            content_type = transform.stream_content_type
        return StreamRelay(
            headers=client_headers(exchange, content_type),
            head=b"".join(head),
            head_units=units,
            body=body,
            tap=tap,
            exchange=exchange,
            metrics=self._metrics,
            on_close=handed.aclose,
            on_upstream_failure=lambda kind: self._pool.record_outcome(provider, endpoint, ok=False),
            transform=transform,
            secrets=provider_secrets(provider),
        )

    async def _complete(
        self,
        exchange: Exchange,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        response: Any,
        transform: ResponseTransform | None,
        *,
        ticket: Ticket,
    ) -> Answer:
        """A non-streamed answer: read it whole, take its usage, rewrite the model name."""
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("text/html"):  # a login page or a proxy's notice, not an answer
            raise await self._failures.wrong_content_type(provider, endpoint, content_type, None)
        try:
            with upstream_errors():
                data = await read_at_most(response, self._config.defaults.max_response_bytes)
        except UpstreamFailure as failure:
            raise self._failures.failed(provider, endpoint, failure) from None
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):  # an event stream, a proxy's page, a truncated body: never relayed
            raise self._failures.bad_response(provider, endpoint, "answered a non-streamed request with a body that is not a JSON object")
        self._pool.record_outcome(provider, endpoint, ok=True, ticket=ticket)
        if parsed.get("error") is not None and "choices" not in parsed and "data" not in parsed:
            error = parsed["error"]  # an OpenAI error object, or a bare string (TileRT's)
            raise self._failures.error_event(provider, endpoint, error if isinstance(error, dict) else {"message": str(error)})
        if aborted_answer(parsed):  # nothing reached the client yet: retried like any failure before the first byte
            raise self._failures.bad_response(provider, endpoint, "ended its answer with finish_reason 'abort'")
        exchange.apply_usage(parsed.get("usage"))
        exchange.usage_estimated = not isinstance(parsed.get("usage"), dict)
        if exchange.upstream_model != exchange.public_model and parsed.get("model") == exchange.upstream_model:
            parsed["model"] = exchange.public_model
            data = orjson.dumps(parsed)
        exchange.status = 200
        if transform is not None:
            data = transform.complete(data)
        headers = client_headers(exchange, response.headers.get("content-type", "application/json"))
        # Finished once the body was handed to the server (e2e includes writing it).
        return Answer(body=data, headers=headers, on_sent=lambda: exchange.finish(self._metrics))

    def _record_decode(self, endpoint: EndpointRuntime, exchange: Exchange, tap: StreamTap) -> None:
        """After a stream: its decode speed, for the endpoint's live numbers."""
        if exchange.first_token_at is not None and exchange.last_token_at is not None:
            seconds = exchange.last_token_at - exchange.first_token_at
            self._pool.record_decode(endpoint, tokens=tap.content_chunks, seconds=seconds)

