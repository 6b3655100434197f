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

Which failures are retryable, and how each becomes the client's error, is
:mod:`latgate.forwarding.failures`; whether and when to retry, or move on, is
:mod:`latgate.routing.policies.retry`; one attempt (:class:`~latgate.forwarding.attempt.Attempt`)
is sent and read by :mod:`latgate.forwarding.attempt`. One failure is retried on the same
endpoint at once, whatever ``max_retries`` says (``after_failure`` says so too): a
stream's ``stream_options`` refused with a 400 (or 422) naming them, sent again without
them (withheld from the provider for a while on evidence:
:mod:`latgate.live.providers.stream_options`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from latgate.forwarding.attempt import Attempt, AttemptSender, Routed
from latgate.forwarding.exchange import Exchange
from latgate.forwarding.failures import AttemptFailed, Failures
from latgate.forwarding.hedge import Race, run_hedged
from latgate.forwarding.keepalive import EarlyHead, EarlyStream, keepalive_seconds, wait_briefly
from latgate.forwarding.largebody import is_large
from latgate.forwarding.recorder import Recorder
from latgate.forwarding.transform import ResponseTransform
from latgate.forwarding.wire import upstream_payload
from latgate.foundation.config.schema import Config
from latgate.foundation.errors import ContextLengthExceeded, GatewayError, Overloaded, UpstreamUnavailable
from latgate.foundation.metrics import Metrics
from latgate.live.providers import EndpointRuntime, ProviderPool
from latgate.live.providers.catalog import context_tokens, fits, window_refusal
from latgate.live.providers.runtime import ProviderRuntime
from latgate.routing.admission import Admission, Ask
from latgate.routing.decision import RouteDecision
from latgate.routing.policies.retry import after_failure
from latgate.routing.policies.retry_budget import hedge_suppressed, within_budget
from latgate.routing.queue_preempt import Preempted
from latgate.routing.queue_refuse import overflow_targets
from latgate.routing.selection import Selector
from latgate.transport.upstream import UpstreamClient


class Forwarder:
    """Owns the send -> retry -> fallback loop for every request.

    Args:
        config: the resolved config (timeouts, retries).
        pool: the providers and their endpoints.
        client: the pooled upstream client.
        metrics: where retries, fallbacks and errors are counted.
        recorder: where finished requests go (the app's).
        sleep: awaited between retries (injectable for tests).
        selector: the routing strategy over live numbers (one for ``config`` and
            ``pool`` by default).
    """

    def __init__(
        self,
        *,
        config: Config,
        pool: ProviderPool,
        client: UpstreamClient,
        metrics: Metrics,
        recorder: Recorder,
        sleep: Callable[[float], Any] = asyncio.sleep,
        selector: Selector | None = None,
    ) -> None:
        self._config = config
        self._pool = pool
        self._client = client
        self._metrics = metrics
        self._recorder = recorder
        self._sleep = sleep
        self.selector = selector or Selector(config=config, pool=pool)
        failures = Failures(pool=pool, metrics=metrics)
        self._sender = AttemptSender(
            config=config, pool=pool, client=client, metrics=metrics, recorder=recorder, failures=failures, selector=self.selector
        )
        queue = config.routing.queue
        self.admission = Admission(
            pool=pool,
            metrics=metrics,
            settings=queue,
            enabled=config.routing.admission and queue.enabled and self.selector.strategy.predicts,
        )
        self._extra_in_flight: dict[str, int] = dict.fromkeys(pool.providers, 0)  # retries + hedges, per provider

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
        :mod:`latgate.forwarding.transform`); without it the answer passes through.

        Returns:
            an ASGI response: a :class:`StreamRelay` for streams, else an :class:`Answer`;
            an :class:`~latgate.forwarding.keepalive.EarlyStream` for a stream still without
            content after its ``first_token_keepalive_sec`` (the attempts go on in it).

        Raises:
            GatewayError: every candidate failed; the last failure (its upstream status
                and error envelope where there was one).
        """
        interval = keepalive_seconds(self._config, decision) if exchange.stream else 0.0
        if not interval:
            return await self._planned(exchange, decision, body, path, transform)
        early = EarlyHead()  # the keep-alive stream's and the attempts' shared state
        attempts = asyncio.create_task(self._planned(exchange, decision, body, path, transform, early))
        await wait_briefly(attempts, interval)
        if attempts.done():
            return attempts.result()
        return EarlyStream(
            attempts=attempts, early=early, exchange=exchange, recorder=self._recorder, interval_seconds=interval, transform=transform
        )

    async def _planned(
        self,
        exchange: Exchange,
        decision: RouteDecision,
        body: dict[str, Any],
        path: str,
        transform: ResponseTransform | None,
        early: EarlyHead | None = None,
    ) -> Any:
        completion = exchange.expected_completion or self.selector.expected_completion(
            body, priority=exchange.priority, tenant=exchange.tenant
        )  # set by Gateway.proxy
        ask = Ask(
            exchange.priority, exchange.tenant, exchange.received_at, decision.prompt_tokens + completion[0]
        )  # its fair share's cost: prompt plus expected completion
        while True:
            held = await self._held(exchange, decision, ask)
            plan = self.selector.plan(held, body, completion=completion)  # at once: a slot admission held is free for it
            try:
                return await self._forward(Routed(exchange, held, plan, body, path, transform, early))
            except Preempted:
                # before its first byte, so nothing reached the client: back to the queue,
                # whose hold answers the 503 saying it was preempted where it would shed it
                ask.preempted = True
                exchange.queue_outcome = "requeued"
            finally:
                if plan.reserved:  # no attempt started (a bad body, a cancelled request)
                    self._pool.release(plan.endpoint)

    async def _held(self, exchange: Exchange, decision: RouteDecision, ask: Ask) -> RouteDecision:
        """The decision after the gateway queue (:meth:`Admission.hold`), its wait and
        outcome recorded on ``exchange``."""
        if not self.admission.enabled:
            return decision
        notes: dict[str, str] | None = {} if decision.explain else None
        waited = exchange.queue_ms or 0.0  # a requeued request: its earlier wait too
        try:
            decision, queue_ms = await self.admission.hold(decision, ask, explain=notes)
        except Overloaded as refused:
            exchange.queue_outcome = "preempted" if isinstance(refused, Preempted) else "shed"
            raise
        finally:
            if notes:
                exchange.admission = notes.get("admission")
        if queue_ms is not None:
            exchange.queue_ms = waited + queue_ms
            outcome = {"waited": "admitted", "late": "late"}.get(decision.reason.partition(":")[0], "overflow")
            exchange.queue_outcome = "requeued" if ask.preempted and outcome == "admitted" else outcome
        return decision

    def _may_retry(self, provider: ProviderRuntime, kind: str) -> bool:
        """Whether one more retry or hedge (``kind``) fits ``provider``'s retry budget
        (:mod:`latgate.routing.policies.retry_budget`); counted when it does not."""
        queue = self._config.routing.queue
        active = sum(ep.in_flight for ep in provider.endpoints)
        extra = self._extra_in_flight[provider.name]
        if within_budget(extra_in_flight=extra, active=active, percent=queue.retry_budget_percent, floor=queue.retry_budget_min):
            return True
        self._metrics.record_budget_denied(provider=provider.name, kind=kind)
        return False

    async def _extra(self, provider: str, attempt: Awaitable[Any]) -> Any:
        """Run a retry or hedge, counted in ``provider``'s extra attempts in flight until
        it returns (its first byte, for a stream)."""
        self._extra_in_flight[provider] += 1
        try:
            return await attempt
        finally:
            self._extra_in_flight[provider] -= 1

    async def _send(self, attempt: Attempt, *, extra: bool) -> Any:
        """One attempt: a ``batch`` one under the queue's preemption guard, a retry
        counted against the budget."""
        routed = attempt.routed
        sent = self._sender.send(attempt)
        guard = self.admission.guard(attempt.provider.name, routed.exchange.priority)
        if guard is not None:
            sent = guard.run(sent, routed.exchange, routed.early)
        return await (self._extra(attempt.provider.name, sent) if extra else sent)

    # long: the one loop that decides retries and fallbacks (after_failure's steps); tried, retries_done, targets
    # and last are its state across iterations, and spreading them over helpers would hide the order of decisions
    async def _forward(self, routed: Routed) -> Any:
        """Attempts along the plan: retries on a provider, then its fallbacks, as
        :func:`~latgate.routing.policies.retry.after_failure` says after each failure,
        each endpoint as the selector chooses it."""
        exchange, decision, plan, body = routed.exchange, routed.decision, routed.plan, routed.body
        if plan.overflow_from is not None:
            self._metrics.record_overflow(from_provider=plan.overflow_from, to_provider=plan.targets[0].provider)
        if decision.explain:
            exchange.route_candidates = plan.explain_header()
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
        stop = False
        while position + 1 < len(targets) and not stop:
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
            if is_large(body):  # encoded in slices off the event loop (latgate.forwarding.largebody)
                payload = await asyncio.to_thread(upstream_payload, body, target, provider, stream=exchange.stream, path=routed.path)
            else:
                payload = upstream_payload(body, target, provider, stream=exchange.stream, path=routed.path)
            exchange.fallback_model = target.fallback_model
            retries_done = 0
            again: Attempt | None = None  # the same endpoint's attempt, as after_failure said
            while again is not None or retries_done <= max_retries:
                if again is not None:  # not one of max_retries, nor of the retry budget
                    attempt, again = again, None
                    self._metrics.record_retry(provider=provider.name)
                else:
                    if retries_done:
                        if not self._may_retry(provider, "retry"):
                            break  # over the retry budget: on to the next provider, if any
                        self._metrics.record_retry(provider=provider.name)
                    endpoint = plan.endpoint
                    if tried or endpoint in small:
                        endpoint = self.selector.next_endpoint(provider, plan, exclude=tried + small)
                        if endpoint in small:
                            break  # the endpoints whose window fits are all tried or unavailable
                    tried.append(endpoint)
                    # Only another endpoint or provider is worth giving up on this one for:
                    # a retry would go back to the same endpoint once every one is tried.
                    untried = retries_done < max_retries and any(other not in tried for other in provider.endpoints)
                    attempt = Attempt(
                        routed, target, provider, endpoint, payload, last=position == len(targets) - 1 and not untried
                    )
                try:
                    if plan.hedge is not None and exchange.stream and len(tried) == 1:
                        return await self._hedged(attempt)
                    return await self._send(attempt, extra=retries_done > 0)
                except AttemptFailed as failed:
                    last = failed.error
                    if failed.busy:  # full, not failing: the next candidate at once, no retry here
                        busy_from = provider.name
                        targets[position + 1 :] = overflow_targets(targets[position + 1 :], decision, busy_from)
                    step = after_failure(
                        retryable=failed.retryable, busy=failed.busy, client_mistake=failed.client_mistake,
                        retry_after_seconds=failed.retry_after, retries_done=retries_done, max_retries=max_retries,
                        stream_options_refused=failed.stream_options_refused == provider.name,
                    )  # fmt: skip
                    if step.without_stream_options:
                        again = dataclasses.replace(
                            attempt, stream_options_refused=True,
                            payload=upstream_payload(body, target, provider, stream=True, path=routed.path, stream_options=False),
                        )  # fmt: skip
                        continue
                    if not step.retry:
                        stop = not step.next_provider  # the client's own mistake: another provider would say the same
                        break
                    await self._sleep(step.delay_seconds)
                    retries_done += 1
        if refused and not tried:
            raise ContextLengthExceeded(window_refusal(exchange.public_model, plan.prompt_tokens, None, refused), param="messages")
        if plan.cause is not None and not stop:  # stop: the client's own mistake, whatever the circuit
            last.message = f"{last.message}; {plan.cause}"
            last.cause = plan.cause if last.cause is None else f"{last.cause}; {plan.cause}"
        raise last

    async def _hedged(self, attempt: Attempt) -> Any:
        """The first attempt, and the plan's hedge if no first token came by its delay."""
        routed = attempt.routed
        hedge = routed.plan.hedge
        assert hedge is not None
        race = Race()
        sent: list[str] = []

        def second() -> Any:
            now = self.selector.hedge_target(routed.plan)  # chosen now: load moved since the plan
            if now is None:
                return None
            runtime = self._pool[now.target.provider]
            first_runtime = attempt.provider
            clock = self._pool.clock()
            if hedge_suppressed([ep.busy(clock) for ep in first_runtime.endpoints], share=self._config.routing.queue.hedge_slow_share):
                self._metrics.record_budget_denied(provider=first_runtime.name, kind="hedge_slow")
                return None
            if not self._may_retry(runtime, "hedge"):
                return None
            self._metrics.record_hedge(provider=runtime.name)
            sent.append(runtime.name)
            copy = (
                attempt.payload
                if now.target == attempt.target
                else upstream_payload(routed.body, now.target, runtime, stream=True, path=routed.path)
            )
            return self._extra(runtime.name, self._sender.send(Attempt(routed, now.target, runtime, now.endpoint, copy, race=race)))

        first = dataclasses.replace(attempt, last=False, race=race)
        response, hedge_won = await run_hedged(
            lambda: self._sender.send(first), second, delay_seconds=hedge.delay_ms / 1000.0
        )
        if hedge_won:
            self._metrics.record_hedge_win(provider=sent[0])
        return response
