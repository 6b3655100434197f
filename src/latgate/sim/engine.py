"""The simulated engine: a FIFO batch scheduler and its timing model.

At most ``max_batch_size`` generations hold a slot ("running"); the others wait in
arrival order ("waiting"), like vLLM's scheduler with its ``num_requests_running`` /
``num_requests_waiting`` gauges. One generation's timeline::

    start()                 joins the queue (or takes a free slot at once)
    await first_token()     waits for a slot, then
                            ttft_overhead + uncached_prompt_tokens / prefill rate
    await next_token()      tpot_ms + tpot_growth_ms * (running - 1), read per token
    close()                 frees the slot (or leaves the queue); always call it

Time comes from an injected :class:`~latgate.sim.clock.Clock`, so the whole model can
run on virtual time in tests.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from latgate.sim.clock import Clock
from latgate.sim.options import SimOptions
from latgate.sim.prefix_cache import PrefixCache


class Engine:
    """The batch scheduler shared by every request of one simulator.

    Args:
        options: timing and batch size (see :class:`~latgate.sim.options.SimOptions`).
        clock: time source; :class:`~latgate.sim.clock.MonotonicClock` in a server.
    """

    def __init__(self, *, options: SimOptions, clock: Clock) -> None:
        self.options = options
        self.clock = clock
        self.prefix_cache = PrefixCache()
        self._running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def running(self) -> int:
        """Generations holding a slot (prefilling or decoding)."""
        return self._running

    @property
    def waiting(self) -> int:
        """Generations queued for a slot."""
        return len(self._waiters)

    def cached_prefix_segments(self, digests: Sequence[bytes]) -> int:
        """Leading prompt segments already in the prefix cache (0 when the cache is off)."""
        if not self.options.prefix_cache:
            return 0
        return self.prefix_cache.cached_segments(digests)

    def tpot_seconds(self) -> float:
        """Time per output token at the current batch size."""
        extra = max(0, self._running - 1)
        return (self.options.tpot_ms + self.options.tpot_growth_ms * extra) / 1000.0

    def start(
        self, *, prompt_tokens: int, cached_tokens: int = 0, prefix_digests: Sequence[bytes] = ()
    ) -> Generation:
        """Queue one request; it counts as running or waiting from this call on.

        Args:
            prompt_tokens: the prompt's length in tokens.
            cached_tokens: how many of them the prefix cache already holds (these cost
                no prefill time).
            prefix_digests: the prompt's prefix digests, remembered by the cache once
                prefill is done.
        """
        return Generation(
            engine=self,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            prefix_digests=prefix_digests,
        )

    def _enter(self) -> asyncio.Future[None] | None:
        if self._running < self.options.max_batch_size and not self._waiters:
            self._running += 1
            return None
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(ticket)
        return ticket

    def _leave_queue(self, ticket: asyncio.Future[None]) -> None:
        try:
            self._waiters.remove(ticket)
        except ValueError:
            pass

    def _release(self) -> None:
        while self._waiters:
            ticket = self._waiters.popleft()
            if not ticket.done():
                ticket.set_result(None)  # the slot passes to the next in line
                return
        self._running -= 1


class Generation:
    """One request's passage through the engine (made by :meth:`Engine.start`).

    Attributes (seconds on the engine's clock):
        queued_at: when it joined.
        admitted_at: when it got a slot (``None`` before).
        first_token_at: when its first token was due (``None`` before).
    """

    def __init__(
        self,
        *,
        engine: Engine,
        prompt_tokens: int,
        cached_tokens: int,
        prefix_digests: Sequence[bytes],
    ) -> None:
        self._engine = engine
        self._clock = engine.clock
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = min(max(0, cached_tokens), prompt_tokens)
        self._prefix_digests = prefix_digests
        self.queued_at = self._clock.now()
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self._ticket = engine._enter()
        self._next_token_at = 0.0
        self._closed = False

    @property
    def queue_wait_seconds(self) -> float | None:
        """Time spent waiting for a slot (``None`` while still waiting)."""
        return None if self.admitted_at is None else self.admitted_at - self.queued_at

    @property
    def ttft_seconds(self) -> float | None:
        """Time from joining the engine to the first token (``None`` before it)."""
        return None if self.first_token_at is None else self.first_token_at - self.queued_at

    def prefill_seconds(self) -> float:
        """Fixed overhead plus the uncached prompt's prefill time."""
        options = self._engine.options
        uncached = self.prompt_tokens - self.cached_tokens
        return options.ttft_overhead_ms / 1000.0 + uncached / options.prefill_tokens_per_second

    async def first_token(self) -> None:
        """Wait for a slot, then for prefill; returns when the first token is due."""
        if self._ticket is not None:
            await self._ticket
        self.admitted_at = self._clock.now()
        self._next_token_at = self.admitted_at + self.prefill_seconds()
        await self._clock.sleep(self._next_token_at - self._clock.now())
        self.first_token_at = self._next_token_at
        if self._prefix_digests and self._engine.options.prefix_cache:
            self._engine.prefix_cache.insert(self._prefix_digests)

    async def next_token(self) -> None:
        """Return when the next token is due (at most one token of catch-up when late)."""
        tpot = self._engine.tpot_seconds()
        now = self._clock.now()
        self._next_token_at = max(self._next_token_at, now - tpot) + tpot
        await self._clock.sleep(self._next_token_at - now)

    async def pause(self, seconds: float) -> None:
        """Stall for ``seconds`` while holding the slot (shifts every later token)."""
        self._next_token_at += seconds
        await self._clock.sleep(self._next_token_at - self._clock.now())

    def close(self) -> None:
        """Free the slot or leave the queue; idempotent, safe after cancellation."""
        if self._closed:
            return
        self._closed = True
        ticket = self._ticket
        if ticket is not None and (not ticket.done() or ticket.cancelled()):
            ticket.cancel()
            self._engine._leave_queue(ticket)
            return
        self._engine._release()
