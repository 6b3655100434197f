"""Providers and their endpoints (replicas) at run time.

The config says what exists; this module tracks what is happening: each endpoint's
live numbers (:class:`~latgate.live.providers.endpoint.EndpointRuntime`: in flight, queue, TTFT
fit, errors), its circuit (:mod:`latgate.live.providers.health`), and the provider's key
read from its environment variable once at start. Which endpoint a request goes to is
the :class:`~latgate.routing.selection.Selector`'s business; each attempt reports
back here what happened (:meth:`ProviderPool.begin` / :meth:`~ProviderPool.end`,
:meth:`~ProviderPool.record_first_token`, :meth:`~ProviderPool.record_outcome`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping

from latgate.foundation.config.apikeys import header_key
from latgate.foundation.config.schema import Config
from latgate.foundation.metrics import Metrics
from latgate.live.connectors import get_connector
from latgate.live.providers.cache_evidence import counters_evidence, take_report
from latgate.live.providers.describe import describe_providers
from latgate.live.providers.endpoint import EndpointRuntime
from latgate.live.providers.engine_cache import EngineCacheFacts
from latgate.live.providers.health import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    CircuitBreaker,
    CircuitStore,
    MemoryCircuitStore,
    Transition,
)
from latgate.live.providers.latency_judge import judge_latency
from latgate.live.providers.runtime import ProviderRuntime
from latgate.live.providers.ticket import Ticket
from latgate.live.store.sessions import LocalSessionMap
from latgate.routing.policies.completion_length import CompletionLengths
from latgate.routing.prefix_index import PromptPrefix
from latgate.routing.sessions import SessionMap
from latgate.routing.strategies.registry import predicts
from latgate.transport.egress import egress_for

log = logging.getLogger("latgate")
BUSY_SECONDS = 1.0
MAX_BUSY_SECONDS = 10.0
TRIAL_LEASE_SECONDS = 30.0
"""A half-open circuit's trial, once handed out, is not handed out again for this long
unless it ends first (a request routed but never sent does not block trials forever)."""


class ProviderPool:
    """All providers of a config, by name, and what happens to their endpoints.

    Args:
        config: the resolved config (providers, ``[health]``, routing strategy: latency
            ejection runs only with a strategy that predicts, ``predicted_latency``).
        metrics: where in-flight gauges, endpoint health and ejections are exported.
        env: where ``api_key_env`` variables are read (``os.environ`` by default).
        clock: seconds, monotonic: circuit timing and engine-gauge age.
        circuits: where circuits are kept (this process only by default).
        sessions: where client sessions' placements are kept (:mod:`latgate.live.store.sessions`;
            this process only by default, one shared over Redis with ``[state]``).
    """

    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        circuits: CircuitStore | None = None,
        sessions: SessionMap | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.config = config
        self.clock = clock
        self.breaker = CircuitBreaker(
            settings=config.health, store=circuits or MemoryCircuitStore(), clock=clock
        )
        self.latency_ejection = predicts(config.routing.strategy)
        self.on_first_token: Callable[[EndpointRuntime, Ticket], None] | None = None
        """Called at each attempt's first token: the routing strategy's
        :meth:`~latgate.routing.strategies.Strategy.on_first_token` (set by the selector)."""
        self.sessions: SessionMap = LocalSessionMap() if sessions is None else sessions
        """Where each client session's last turn was served (:mod:`latgate.routing.sessions`):
        in process by default, or shared by the replicas through ``[state]``."""
        self.slot_freed: Callable[[ProviderRuntime, EndpointRuntime, float | None], None] | None = None
        """Called when a slot of an endpoint may have freed (the gateway queue's wake-up),
        with how long the request that left held it (seconds; None when unknown or it
        failed); set by :class:`~latgate.routing.admission.Admission`."""
        self.completion_lengths = CompletionLengths()
        """Recent completion tokens of the streams answered, by tenant, class and
        pool-wide (:mod:`latgate.routing.policies.completion_length`)."""
        self._metrics = metrics
        self.providers: dict[str, ProviderRuntime] = {}
        for name, provider in config.providers.items():
            key = header_key(env.get(provider.api_key_env, "")) if provider.api_key_env else ""
            runtime = ProviderRuntime(
                config=provider,
                connector=get_connector(provider.connector),
                endpoints=[
                    EndpointRuntime.for_provider(provider, ep, breaker=self.breaker)
                    for ep in provider.endpoints
                ],
                auth_headers={"authorization": f"Bearer {key}"} if key else {},
                egress=egress_for(provider, env),
            )
            self.providers[name] = runtime
            for endpoint in runtime.endpoints:
                metrics.set_endpoint_health(provider=name, endpoint=endpoint.config.id, healthy=True)

    def __getitem__(self, name: str) -> ProviderRuntime:
        return self.providers[name]

    # -- what can take traffic ------------------------------------------------------------

    def available(self, endpoint: EndpointRuntime) -> bool:
        """True when ``endpoint`` may take a request now: circuit closed, or half-open
        with no trial running."""
        circuit = self.breaker.circuit(endpoint.key)
        return circuit == CLOSED or (circuit == HALF_OPEN and self.clock() >= endpoint.trial_until)

    def reserve(self, endpoint: EndpointRuntime) -> None:
        """Count a request routed to ``endpoint`` as load before its attempt starts (the
        forwarder calls :meth:`release` when it starts, or when it never does)."""
        endpoint.pending += 1

    def release(self, endpoint: EndpointRuntime) -> None:
        """Drop a reservation made by :meth:`reserve`."""
        endpoint.pending -= 1

    def take_trial(self, endpoint: EndpointRuntime) -> None:
        """Hand ``endpoint``'s trial to the request being routed there, if it is
        half-open: no other request is sent there until that one ends."""
        if self.breaker.circuit(endpoint.key) == HALF_OPEN:
            endpoint.trial_until = max(endpoint.trial_until, self.clock() + TRIAL_LEASE_SECONDS)

    def any_healthy(self) -> bool:
        """True when at least one endpoint of any provider may take traffic (``/readyz``)."""
        return any(self.available(ep) for p in self.providers.values() for ep in p.endpoints)

    def describe(self) -> dict[str, dict[str, object]]:
        """Every provider's endpoints with the live numbers behind routing decisions
        (``/admin/providers``, ``/ui``: :func:`~latgate.live.providers.describe.describe_providers`)."""
        return describe_providers(self.providers, self.clock())

    # -- a request's life on an endpoint ---------------------------------------------------

    def begin(
        self,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        *,
        prompt_tokens: int = 0,
        queue_ms: float = 0.0,
        prefix: PromptPrefix | None = None,
        completion_tokens: int = 0,
    ) -> Ticket:
        """Count an attempt in flight on ``endpoint`` from now; :meth:`end` must follow (the forwarder
        calls it from the attempt's exit stack, a plain callback: cheaper per request than an async
        context manager). With the prompt's ``prefix``, the tokens ``endpoint`` is believed to hold
        are taken out of its TTFT observation and the rest counts as prefill ahead of later requests
        until its first token; ``completion_tokens`` (0: unknown) is kept in ``endpoint.leases``."""
        ticket = Ticket(prompt_tokens=prompt_tokens, queue_ms=queue_ms, started_at=time.perf_counter())
        ticket.estimated_prompt_tokens, ticket.completion_tokens = prompt_tokens, completion_tokens
        if prefix is not None and endpoint.prefix_index is not None:
            cached = self.cached_tokens(endpoint, prefix)
            ticket.prefix, ticket.cached_tokens = prefix, cached
            ticket.prompt_tokens = uncached = max(0, prompt_tokens - cached)
            endpoint.prefill_tokens += uncached
            ticket.prefilling = True
        if self.breaker.circuit(endpoint.key) == HALF_OPEN:
            ticket.trial = True
            self.take_trial(endpoint)
        ticket.sent_at = sent_at = self.clock()
        if ticket.prefilling:  # its work: the prefill ahead of it and its own
            endpoint.prefill_rate.sent(ticket, at=sent_at, work_tokens=endpoint.prefill_tokens)
        endpoint.leases.append((sent_at, completion_tokens))
        endpoint.in_flight += 1
        endpoint.requests += 1
        self._metrics.in_flight_gauge(provider.name).inc()
        return ticket

    def end(self, provider: ProviderRuntime, endpoint: EndpointRuntime, ticket: Ticket) -> None:
        """The attempt is over: a censored one teaches the TTFT fit a lower bound; an
        answered one, how long it held a batch slot."""
        endpoint.leases.remove((ticket.sent_at, ticket.completion_tokens))
        endpoint.in_flight -= 1
        if ticket.prefilling:
            ticket.prefilling = False
            endpoint.prefill_tokens -= ticket.prompt_tokens
            endpoint.prefill_rate.dropped(ticket)
        self._metrics.in_flight_gauge(provider.name).dec()
        if ticket.trial:
            endpoint.trial_until = 0.0
        if ticket.deferred_ttft_ms is not None:  # no usage came with cached tokens: the index's prediction stands
            self._observe_ttft(provider, endpoint, ticket, ticket.deferred_ttft_ms)
        elapsed_ms = (time.perf_counter() - ticket.started_at) * 1000.0
        if ticket.first_token_ms is None and ticket.censored:
            endpoint.observe_at_least(prompt_tokens=ticket.prompt_tokens, ttft_ms=elapsed_ms - ticket.queue_ms, now=self.clock())
            self._judge(provider, endpoint, ticket, elapsed_ms, censored=True)
        elif ticket.succeeded:
            endpoint.observe_slot((elapsed_ms - ticket.queue_ms) / 1000.0)
        if self.slot_freed is not None:
            self.slot_freed(provider, endpoint, elapsed_ms / 1000.0 if ticket.succeeded else None)

    def record_first_token(
        self, provider: ProviderRuntime, endpoint: EndpointRuntime, ticket: Ticket, *, ttft_ms: float
    ) -> None:
        """The attempt's first generated content came ``ttft_ms`` after sending it (its
        prefill is no longer ahead of others'; the strategy hears of it). Where the
        endpoint's answers report cached tokens, the TTFT fit waits for this one's
        (:meth:`record_cached_tokens`, else :meth:`end`)."""
        ticket.first_token_ms = ttft_ms
        self._prefilled(provider, endpoint, ticket)
        if ticket.prefix is not None and endpoint.cache_hits.reports:
            ticket.deferred_ttft_ms = ttft_ms
            return
        self._observe_ttft(provider, endpoint, ticket, ttft_ms)

    def _observe_ttft(self, provider: ProviderRuntime, endpoint: EndpointRuntime, ticket: Ticket, ttft_ms: float) -> None:
        ticket.deferred_ttft_ms = None
        endpoint.observe_ttft(
            prompt_tokens=ticket.prompt_tokens, ttft_ms=ttft_ms, queue_ms=ticket.queue_ms, now=self.clock()
        )
        self._judge(provider, endpoint, ticket, ttft_ms, censored=False)

    def record_outcome(
        self, provider: ProviderRuntime, endpoint: EndpointRuntime, *, ok: bool, ticket: Ticket | None = None
    ) -> None:
        """An attempt's outcome as the endpoint's health sees it: ``ok`` when it answered
        (a 429 counts as answering), not ``ok`` for connection failures, timeouts, 5xx,
        401/403 and broken streams. Client errors are not reported at all."""
        endpoint.observe_outcome(ok=ok)
        if ok:
            endpoint.answered_at = self.clock()
            if ticket is not None:
                ticket.succeeded = True
                if ticket.prefilling:  # a non-streamed answer: no first token was seen
                    self._prefilled(provider, endpoint, ticket)
            transition = self.breaker.on_success(endpoint.key)
        else:
            transition = self.breaker.on_failure(endpoint.key)
        self._apply(provider, endpoint, transition)

    def _prefilled(self, provider: ProviderRuntime, endpoint: EndpointRuntime, ticket: Ticket) -> None:
        """The endpoint prefilled the ticket's prompt (first token, or a non-streamed
        answer): no longer work ahead of others; the strategy hears of it."""
        if not ticket.prefilling:
            return
        ticket.prefilling = False
        endpoint.prefill_tokens -= ticket.prompt_tokens
        endpoint.prefill_rate.prefilled(ticket, now=self.clock())
        hits = endpoint.cache_hits
        hits.predicted_tokens += ticket.cached_tokens
        hits.prompt_tokens += ticket.estimated_prompt_tokens
        if ticket.cached_tokens:
            self._metrics.record_cached_prompt_tokens(provider=provider.name, tokens=ticket.cached_tokens, source="predicted")
        if self.on_first_token is not None:
            self.on_first_token(endpoint, ticket)

    def cached_tokens(self, endpoint: EndpointRuntime, prefix: PromptPrefix) -> int:
        """Prompt tokens of ``prefix`` that ``endpoint`` is believed to hold: its prefix
        index's longest match, and for a client session last served there at least the
        prompt before its last message."""
        index = endpoint.prefix_index
        if index is None:
            return 0
        matched = index.longest_match_tokens(prefix)
        session = prefix.session
        if session is not None and matched < prefix.previous_tokens and self.sessions.get(session) == endpoint.config.id:
            return prefix.previous_tokens
        return matched

    def record_cached_tokens(
        self,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        ticket: Ticket | None,
        *,
        cached_tokens: int,
        prompt_tokens: int,
    ) -> None:
        """The engine's usage reported ``cached_tokens`` of the attempt's ``prompt_tokens``
        served from its prefix cache (``usage.prompt_tokens_details.cached_tokens``),
        counted beside latgate's prediction; evidence for the TTFT fit (on the tokens
        really prefilled) and for the prefix index (an eviction it had not seen:
        :mod:`latgate.live.providers.cache_evidence`)."""
        self._metrics.record_cached_prompt_tokens(provider=provider.name, tokens=cached_tokens, source="reported")
        take_report(endpoint, ticket, cached_tokens=cached_tokens, prompt_tokens=prompt_tokens)
        if ticket is not None and ticket.deferred_ttft_ms is not None:
            self._observe_ttft(provider, endpoint, ticket, ticket.deferred_ttft_ms)

    def record_engine_cache(self, provider: ProviderRuntime, endpoint: EndpointRuntime, cache: EngineCacheFacts) -> None:
        """The engine's prefix-cache facts, just read from its ``/metrics``: its capacity
        bounds the prefix index; where its answers report no cached tokens, the increase
        of its hit counters since the last read is the report (counted as ``reported``,
        and evidence for the index as one answer's would be)."""
        endpoint.engine_cache = cache
        index = endpoint.prefix_index
        if index is None:
            return
        if cache.capacity_tokens:  # what the engine's prefix cache really holds: the index ages out against it
            endpoint.prefix_cache_capacity_tokens = cache.capacity_tokens
        interval = endpoint.cache_hits.counters_interval(cache)
        if interval is None:
            return
        queried, hit, prompt, predicted = interval
        self._metrics.record_cached_prompt_tokens(provider=provider.name, tokens=int(hit), source="reported")
        index.correct(counters_evidence(prompt_tokens=prompt, predicted_cached_tokens=predicted, queried_tokens=queried, hit_tokens=hit))

    def record_busy(self, endpoint: EndpointRuntime, *, seconds: float | None) -> None:
        """The endpoint answered busy (429): at capacity for ``seconds`` (its
        ``Retry-After``, else ``BUSY_SECONDS``), evidence for overflowing from it."""
        endpoint.busy_until = self.clock() + (BUSY_SECONDS if seconds is None else min(seconds, MAX_BUSY_SECONDS))

    @property
    def completion_tokens_mean(self) -> float | None:
        """The expected length of a request that names no ``max_tokens``: the median of
        the pool's recent streams (None before one; robust to one client's outliers)."""
        return self.completion_lengths.pool_median

    def record_decode(
        self, endpoint: EndpointRuntime, *, tokens: int, seconds: float, priority: int | None = None, tenant: str = ""
    ) -> None:
        """A stream produced ``tokens`` completion tokens over ``seconds`` after its first
        (for a request of class ``priority`` charged to ``tenant``, when known)."""
        self.completion_lengths.observe(tokens, priority=priority, tenant=tenant)
        if tokens > 1 and seconds > 0:
            endpoint.observe_itl(seconds * 1000.0 / (tokens - 1), now=self.clock())

    def record_full(self, endpoint: EndpointRuntime) -> None:
        """The endpoint answered that it has no free slot (TileRT's busy 429): it counts
        as full until its next load read or until one of latgate's requests there ends."""
        endpoint.observe_full(now=self.clock())

    def record_probe(
        self, provider: ProviderRuntime, endpoint: EndpointRuntime, *, ok: bool, ms: float, cause: str | None = None
    ) -> None:
        """An active probe's result, ``cause`` why it failed (see :mod:`latgate.live.providers.monitor`)."""
        endpoint.probe_ok, endpoint.probe_ms, endpoint.probe_at, endpoint.probe_cause = ok, ms, self.clock(), cause
        self._apply(provider, endpoint, self.breaker.on_probe(endpoint.key, ok=ok))

    def record_engine_load(
        self,
        provider: ProviderRuntime,
        endpoint: EndpointRuntime,
        *,
        running: int | None,
        waiting: int | None,
        capacity: int | None = None,
    ) -> None:
        """The engine's own load, just read (``capacity``: the slots it says it has): it
        answers, so an endpoint open for errors gets its trial request now."""
        endpoint.observe_engine(running=running, waiting=waiting, now=self.clock(), capacity=capacity)
        self._apply(provider, endpoint, self.breaker.on_alive(endpoint.key))
        if self.slot_freed is not None:
            self.slot_freed(provider, endpoint, None)

    # -- internals -----------------------------------------------------------------------

    def _judge(self, provider: ProviderRuntime, endpoint: EndpointRuntime, ticket: Ticket, ttft_ms: float, *, censored: bool) -> None:
        """A latency verdict (:func:`~latgate.live.providers.latency_judge.judge_latency`),
        with a strategy that predicts."""
        if self.latency_ejection:
            transition = judge_latency(
                self.breaker, self.config.health, provider, endpoint, ticket, ttft_ms, censored=censored, now=self.clock()
            )
            self._apply(provider, endpoint, transition)

    def _apply(
        self, provider: ProviderRuntime, endpoint: EndpointRuntime, transition: Transition | None
    ) -> None:
        if transition is None or transition.before == transition.after:
            return
        endpoint_id = endpoint.config.id
        if transition.after == OPEN:
            record = self.breaker.store.get(endpoint.key)
            self._metrics.record_ejection(
                provider=provider.name, endpoint=endpoint_id, reason=transition.reason or "errors"
            )
            evidence = f" on {endpoint.ejection_evidence}" if transition.reason == "latency" else ""
            log.warning(
                "endpoint %s ejected (%s%s): no traffic for %.0f s, then one trial request",
                endpoint_id,
                transition.reason,
                evidence,
                record.open_seconds,
            )
        elif transition.after == CLOSED:
            log.info("endpoint %s is back (circuit closed)", endpoint_id)
        self._metrics.set_endpoint_health(
            provider=provider.name, endpoint=endpoint_id, healthy=transition.after == CLOSED
        )
