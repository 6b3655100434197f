"""One endpoint at run time, its live numbers: load, time to first token, decode speed, errors.

Everything is measured by the gateway on its own traffic and recency-weighted
(exponential moving averages), seeded from the config (capacity hints, role) and, where
the connector can read them, from the engine's load gauges (vLLM
``vllm:num_requests_running`` / ``vllm:num_requests_waiting``, SGLang's equivalents).

Predicted time to first token = queue wait + the endpoint's fitted line
(:class:`~latgate.live.providers.predictor.TtftPredictor`). The queue wait: with ``C``
batch slots (``max_batch_size``, an engine hint, or inferred from the engine reporting
waiting requests) and ``L`` requests on the endpoint (ours in flight, plus others the
engine reported beyond ours), a new request waits for ``L - C + 1`` of them to leave.
When all ``L`` are latgate's own, their start times are known and the engine serves in
arrival order, so the ``k``-th to leave is the ``k``-th oldest: the wait is what that
one has left of ``slot_seconds`` (how long a request holds a slot), plus a whole
``slot_seconds`` per further round through the ``C`` slots. This matters after a burst,
when every slot was taken at once and none frees soon. With requests of others in the
count, they leave at ``C / slot_seconds`` per second on average. Without a known
capacity the queue is 0 and the fitted line absorbs whatever queueing there is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from latgate.foundation.config.schema import EndpointConfig, ProviderConfig
from latgate.live.providers.cache_hits import CacheHits
from latgate.live.providers.engine_cache import EngineCacheFacts
from latgate.live.providers.health import CLOSED, CircuitBreaker
from latgate.live.providers.predictor import ItlEstimate, TtftPredictor
from latgate.live.providers.prefill_rate import PrefillRate
from latgate.routing.prefix_index import DEFAULT_PREFIX_CACHE_TOKENS, PrefixIndex

EWMA_ALPHA = 0.1
PRIOR_SLOT_SECONDS = 1.0
ENGINE_LOAD_STALE_SECONDS = 5.0
QUEUE_P90_FACTOR = 2.0
"""The queue wait is an estimate from average slot times: requests that hold their slot
longer than average (long generations, a slow client) make it longer, so its 90th
percentile is taken as twice the estimate."""
REFRESH_FACTOR = 2.0
CAPACITY_HINT_KEYS = ("max_num_seqs", "max_running_requests")
_PRIOR_BASE_MS = {"decode": 20.0, "prefill": 100.0, "upstream": 500.0, None: 200.0}
PRIOR_PER_TOKEN_MS = 0.05
"""20 000 prompt tokens per second: a mid-range GPU's prefill rate."""
_PRIOR_ITL_MS = {"decode": 5.0, "prefill": 25.0, "upstream": 20.0, None: 20.0}
"""Time per output token before a stream was measured: a low-latency decode pool runs
small batches (a few ms a token), a throughput pool large ones (tens of ms), a hosted
upstream about 50 tokens per second."""


def configured_capacity(provider: ProviderConfig, endpoint: EndpointConfig | None = None) -> int | None:
    """Batch slots of an endpoint from the config: its own ``max_batch_size`` (an
    ``endpoints`` table entry), else the provider's, else the engine hint
    ``max_num_seqs`` (vLLM) or ``max_running_requests`` (SGLang), else None."""
    if endpoint is not None and endpoint.max_batch_size:
        return endpoint.max_batch_size
    if provider.max_batch_size:
        return provider.max_batch_size
    for key in CAPACITY_HINT_KEYS:
        value = provider.hints.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(slots=True, eq=False)
class EndpointRuntime:
    """Live numbers of one endpoint (one replica of a provider).

    Attributes:
        config: the endpoint's config (``id``, URLs).
        key: ``PROVIDER:ENDPOINT_ID``, the endpoint's name in the circuit store.
        breaker: the pool's circuit breaker (this endpoint's record is ``key``).
        predictor: TTFT (ms) against prompt tokens, queueing taken out.
        capacity: batch slots: the engine's own count when its connector reads one
            (TileRT's ``/pool_status``), else the config's hint, or None.
        in_flight: requests latgate has on it now; ``requests``: since start;
            ``failures``: failed requests since start.
        slot_seconds: recency-weighted time a request holds a batch slot.
        itl: time per output token learned from its streams, with its role's prior
            (``itl_ms``: the measured value, None before a stream).
        itl_observed_at: clock seconds of the last stream measured (None before one).
        itl_refresh: the next stream refreshes a stale estimate (as ``refresh`` does
            for the TTFT fit).
        error_rate: recency-weighted share of failed requests (0..1).
        engine_running / engine_waiting / engine_read_at: the engine's own gauges and
            when they were read (clock seconds); ``engine_own_in_flight``: our
            ``in_flight`` at that moment. ``inferred_capacity``: running requests seen
            while the engine had a queue.
        engine_cache: the prefix-cache facts on the engine's ``/metrics`` (capacity in
            tokens, block size, hit counters: :mod:`latgate.live.providers.engine_cache`),
            from its last load read; None before one, or for engines without them.
        leases: ``(sent_at, expected completion tokens)`` of each of latgate's requests
            in flight (0 tokens: unknown), oldest first: what the gateway queue's wait
            prediction prices each held slot at (:mod:`latgate.routing.queue_outlook`).
        pending: requests routed here whose attempt has not started yet (a hedged
            request's first attempt starts in its own task): counted as load so that
            a burst routed in one go does not all see the same empty endpoint.
        probe_ok / probe_ms / probe_at: the last active probe; probe_cause: why it failed
            (``connection refused``, ``timed out``, ``HTTP 503``; no address), None when ok.
        answered_at: clock seconds of the last request it answered (None before one).
        trial_until: clock seconds until which a half-open circuit's trial is taken
            (handed to a request, or running); 0 when the next request may be the trial.
        observed_at: clock seconds of the last first token measured (None before one).
        measured_ttft_ms: recency-weighted measured TTFT, queueing included (None
            before one).
        chosen_turn: the provider's request counter when this endpoint was last chosen.
        refresh: the next first token refreshes a stale estimate: when it disagrees
            with the fit by more than ``REFRESH_FACTOR``, the fit restarts from it.
        busy_until: clock seconds until which a busy answer (429) marks it at capacity.
        ejection_evidence: the estimate its last latency verdict was based on (shown in
            ``/admin/providers``, the debug view and the ejection's log line).
        catalog: the engine's ``/v1/models`` objects by model id, once read
            (:mod:`latgate.live.providers.catalog`); None before.
        prefix_index: the prompt prefixes its engine is believed to hold
            (:mod:`latgate.routing.prefix_index`), None when its provider's engine keeps
            no prefix cache; its capacity is :attr:`prefix_cache_capacity_tokens`.
        prefill_tokens: uncached prompt tokens of latgate's attempts sent here and
            still without a first token: the prefill work ahead of a new request.
        cache_hits: prompt tokens served from its engine's prefix cache, predicted
            against reported (:class:`~latgate.live.providers.cache_hits.CacheHits`).
        prefill_rate: ms per prompt token it prefills now (:mod:`~latgate.live.providers.prefill_rate`).
    """

    config: EndpointConfig
    key: str
    breaker: CircuitBreaker
    predictor: TtftPredictor
    capacity: int | None = None
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    slot_seconds: float = PRIOR_SLOT_SECONDS
    itl: ItlEstimate = field(default_factory=lambda: ItlEstimate(prior_ms=_PRIOR_ITL_MS[None]))
    itl_observed_at: float | None = None
    itl_refresh: bool = False
    error_rate: float = 0.0
    engine_running: int | None = None
    engine_waiting: int | None = None
    engine_read_at: float | None = None
    engine_own_in_flight: int = 0
    engine_cache: EngineCacheFacts | None = None
    inferred_capacity: int | None = None
    leases: list[tuple[float, int]] = field(default_factory=list)
    pending: int = 0
    probe_ok: bool | None = None
    probe_ms: float | None = None
    probe_at: float | None = None
    probe_cause: str | None = None
    answered_at: float | None = None
    trial_until: float = 0.0
    observed_at: float | None = None
    measured_ttft_ms: float | None = None
    chosen_turn: int = 0
    refresh: bool = False
    busy_until: float = 0.0
    ejection_evidence: str | None = None
    catalog: dict[str, dict[str, Any]] | None = None
    prefix_index: PrefixIndex | None = None
    prefill_tokens: int = 0
    cache_hits: CacheHits = field(default_factory=CacheHits)
    prefill_rate: PrefillRate = field(default_factory=PrefillRate)

    @classmethod
    def for_provider(
        cls, provider: ProviderConfig, endpoint: EndpointConfig, *, breaker: CircuitBreaker
    ) -> EndpointRuntime:
        """Fresh live numbers seeded from the provider's config (capacity, role priors)."""
        prior_base_ms = _PRIOR_BASE_MS.get(provider.role, _PRIOR_BASE_MS[None])
        return cls(
            config=endpoint,
            key=f"{provider.name}:{endpoint.id}",
            breaker=breaker,
            predictor=TtftPredictor(prior_base_ms=prior_base_ms, prior_per_token_ms=PRIOR_PER_TOKEN_MS),
            capacity=configured_capacity(provider, endpoint),
            itl=ItlEstimate(prior_ms=_PRIOR_ITL_MS.get(provider.role, _PRIOR_ITL_MS[None])),
            prefix_index=PrefixIndex(capacity_tokens=provider.prefix_cache_tokens or DEFAULT_PREFIX_CACHE_TOKENS)
            if provider.caches_prefixes
            else None,
        )

    def rebind(self, fresh: EndpointRuntime, *, before: ProviderConfig, after: ProviderConfig) -> None:
        """Keep these live numbers under a reloaded config: take ``fresh``'s config,
        key and breaker (the new pool's), and its configured capacity when the config
        changed it (``before`` / ``after``: the provider's configs; else a capacity the
        engine reported stays). Everything measured stays (see
        :func:`~latgate.live.providers.carry.carry_live_state`)."""
        if configured_capacity(before, self.config) != configured_capacity(after, fresh.config):
            self.capacity = fresh.capacity
        self.config, self.key, self.breaker = fresh.config, fresh.key, fresh.breaker
        if before.caches_prefixes != after.caches_prefixes:  # enable_prefix_cache turned on or off
            self.prefix_index = fresh.prefix_index
        elif self.prefix_index is not None and before.prefix_cache_tokens != after.prefix_cache_tokens:
            self.prefix_cache_capacity_tokens = fresh.prefix_cache_capacity_tokens or 0

    @property
    def prefix_cache_capacity_tokens(self) -> int | None:
        """Tokens its engine's prefix cache holds (None: no prefix cache). Set it from
        what the engine reports (vLLM's cache config on ``/metrics``): the index ages
        out against it from the next request on."""
        return None if self.prefix_index is None else self.prefix_index.capacity_tokens

    @prefix_cache_capacity_tokens.setter
    def prefix_cache_capacity_tokens(self, tokens: int) -> None:
        if self.prefix_index is not None and tokens > 0:
            self.prefix_index.capacity_tokens = tokens

    # -- health (the circuit lives in the breaker's store) ------------------------------

    @property
    def circuit(self) -> str:
        """``closed``, ``open`` or ``half_open`` now."""
        return self.breaker.circuit(self.key)

    @property
    def healthy(self) -> bool:
        """True when the circuit is closed. Setting it ejects (``False``: open, reason
        ``shared``) or restores (``True``) the endpoint, for the health replicas share."""
        return self.breaker.circuit(self.key) == CLOSED

    @healthy.setter
    def healthy(self, value: bool) -> None:
        if value:
            self.breaker.restore(self.key)
        else:
            self.breaker.eject(self.key, reason="shared")

    @property
    def consecutive_failures(self) -> int:
        """Failed requests since the last success (the circuit's counter)."""
        return self.breaker.store.get(self.key).consecutive_failures

    @consecutive_failures.setter
    def consecutive_failures(self, value: int) -> None:
        record = self.breaker.store.get(self.key)
        record.consecutive_failures = value
        self.breaker.store.put(self.key, record)

    # -- predictions ----------------------------------------------------------------------

    def load(self, now: float) -> int:
        """Requests on the endpoint: ours in flight or routed here and about to be sent,
        plus others the engine reported beyond ours when its gauges are recent."""
        return self.in_flight + self.pending + self._others(now)

    def _others(self, now: float) -> int:
        if self.engine_read_at is None or now - self.engine_read_at > ENGINE_LOAD_STALE_SECONDS:
            return 0
        others = (self.engine_running or 0) + (self.engine_waiting or 0) - self.engine_own_in_flight
        return max(0, others)

    def others(self, now: float) -> int:
        """Requests the engine reported beyond latgate's own (0 when its gauges are stale)."""
        return self._others(now)

    def busy(self, now: float) -> bool:
        """Known to be at capacity: its load at its batch slots, the engine reporting
        waiting requests (recent gauges), or a busy answer lately."""
        if now < self.busy_until:
            return True
        capacity = self.capacity or self.inferred_capacity
        if capacity is not None and self.load(now) >= capacity:
            return True
        recent = self.engine_read_at is not None and now - self.engine_read_at <= ENGINE_LOAD_STALE_SECONDS
        return recent and bool(self.engine_waiting)

    def queue_ms(self, now: float) -> float:
        """Expected wait before this endpoint prefills a new request, in ms: for a batch
        slot (0 with room, or no known capacity), at least what is left of a busy
        answer's ``Retry-After``; with a prefix cache, plus the prefill of the uncached
        prompt tokens already sent here without a first token (``prefill_tokens`` at
        the fitted ms per token: an engine's prefill is compute-bound, so what is
        ahead is prefilled first)."""
        wait = self._slot_wait_ms(now)
        if self.prefill_tokens and self.prefix_index is not None:
            wait += self.prefill_tokens * self.predictor.per_token_ms
        if now < self.busy_until:
            return max((self.busy_until - now) * 1000.0, wait)
        return wait

    def _slot_wait_ms(self, now: float) -> float:
        capacity = self.capacity or self.inferred_capacity
        if capacity is None:
            return 0.0
        others = self._others(now)
        ahead = self.in_flight + self.pending + others - capacity + 1
        if ahead <= 0:
            return 0.0
        leases = self.leases
        if others or len(leases) != self.in_flight:
            return ahead * self.slot_seconds * 1000.0 / capacity
        rounds, index = divmod(ahead - 1, capacity)
        started = leases[index][0] if index < len(leases) else now  # routed, not yet sent: starts now
        left = self.slot_seconds - (now - started)
        return (max(0.0, left) + rounds * self.slot_seconds) * 1000.0

    def predicted_ttft_ms(self, prompt_tokens: int, now: float) -> float:
        """Queue wait plus the fitted TTFT for ``prompt_tokens``, in ms."""
        return self.queue_ms(now) + self.predictor.predict_ms(prompt_tokens)

    def p90_ttft_ms(self, prompt_tokens: int, now: float) -> float:
        """A pessimistic (90th percentile) TTFT in ms: the fit's p90 plus
        ``QUEUE_P90_FACTOR`` times the queue wait."""
        return QUEUE_P90_FACTOR * self.queue_ms(now) + self.predictor.p90_ms(prompt_tokens)

    # -- observations -----------------------------------------------------------------------

    def observe_ttft(self, *, prompt_tokens: int, ttft_ms: float, queue_ms: float, now: float) -> None:
        """A measured first token ``ttft_ms`` after sending, ``queue_ms`` of it
        predicted as the wait for a slot: refits the line (a refresh that disagrees
        with a stale fit by more than ``REFRESH_FACTOR`` restarts it from this one)."""
        predictor = self.predictor
        own = ttft_ms - queue_ms
        restart = False
        if self.refresh:
            self.refresh = False
            ratio = max(own, 1.0) / max(predictor.predict_ms(prompt_tokens), 1.0)
            restart = not 1.0 / REFRESH_FACTOR <= ratio <= REFRESH_FACTOR
        if restart:
            predictor.restart(prompt_tokens=prompt_tokens, ttft_ms=own)
        else:
            predictor.observe(prompt_tokens=prompt_tokens, ttft_ms=own)
        measured = self.measured_ttft_ms
        self.measured_ttft_ms = ttft_ms if measured is None else measured + EWMA_ALPHA * 2 * (ttft_ms - measured)
        self.observed_at = now

    def observe_at_least(self, *, prompt_tokens: int, ttft_ms: float, now: float) -> None:
        """A censored attempt: no first token after ``ttft_ms`` (queue wait taken out);
        evidence when it exceeds the prediction (:meth:`TtftPredictor.observe_at_least`)."""
        before = self.predictor.observations
        self.predictor.observe_at_least(prompt_tokens=prompt_tokens, ttft_ms=ttft_ms)
        if self.predictor.observations != before:
            self.observed_at = now

    def observe_slot(self, seconds: float) -> None:
        """A finished request held a batch slot for ``seconds``."""
        if seconds > 0.0:
            self.slot_seconds += EWMA_ALPHA * (seconds - self.slot_seconds)

    @property
    def itl_ms(self) -> float | None:
        """The measured time per output token (ms), None before a stream."""
        return self.itl.ms

    def observe_itl(self, ms: float, *, now: float) -> None:
        """A stream's mean time between output tokens (ms), finished at ``now``; a
        refresh that disagrees with the estimate by more than ``REFRESH_FACTOR``
        restarts it from this one."""
        itl = self.itl
        if self.itl_refresh:
            self.itl_refresh = False
            if itl.ms is not None and not 1.0 / REFRESH_FACTOR <= max(ms, 1.0) / max(itl.ms, 1.0) <= REFRESH_FACTOR:
                itl.restart(ms)
                self.itl_observed_at = now
                return
        itl.observe(ms)
        self.itl_observed_at = now

    def observe_outcome(self, *, ok: bool) -> None:
        """A request's outcome, for the error rate."""
        self.error_rate += EWMA_ALPHA * ((0.0 if ok else 1.0) - self.error_rate)
        if not ok:
            self.failures += 1

    def observe_full(self, *, now: float) -> None:
        """The engine refused a request for want of a slot: every slot is taken (by
        latgate's other requests in flight, and others), as if read from its gauges."""
        own = max(0, self.in_flight - 1)  # the refused attempt is still counted, and about to end
        capacity = self.capacity or self.inferred_capacity
        if capacity is None and own:
            self.inferred_capacity = capacity = own
        self.engine_running, self.engine_waiting = max(capacity or 0, own), 0
        self.engine_read_at, self.engine_own_in_flight = now, own

    def observe_engine(
        self, *, running: int | None, waiting: int | None, now: float, capacity: int | None = None
    ) -> None:
        """The engine's load gauges, read at ``now``; ``capacity``: the slots the engine
        says it has (TileRT's decode nodes), which replaces the configured hint."""
        if capacity:
            self.capacity = capacity
        if running is None and waiting is None:
            return
        self.engine_running, self.engine_waiting = running, waiting
        self.engine_read_at = now
        self.engine_own_in_flight = self.in_flight
        if running and waiting:
            self.inferred_capacity = running
