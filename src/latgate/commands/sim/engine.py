"""The simulated engine: a FIFO batch scheduler and its timing model.

At most ``max_batch_size`` generations hold a slot ("running"); the others wait in
arrival order ("waiting"), like vLLM's scheduler with its ``num_requests_running`` /
``num_requests_waiting`` gauges. With ``prefill_concurrency`` N > 0, at most N of the
running ones prefill at once and the others wait for them in arrival order: prefill is
compute-bound, so a prompt that misses the cache delays every prefill behind it. One
generation's timeline::

    start()                 joins the queue (or takes a free slot at once)
    await first_token()     waits for a slot, then for a prefill turn; looks the
                            prompt's blocks up in the prefix cache, then
                            ttft_overhead + uncached_prompt_tokens / prefill rate;
                            then the prompt's blocks enter the cache
    await next_token()      tpot_ms + tpot_growth_ms * (running - 1), read per token
    close()                 frees the slot (or leaves the queue); always call it

Time comes from an injected :class:`~latgate.commands.sim.clock.Clock`, so the whole model can
run on virtual time in tests.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from latgate.commands.sim.clock import Clock
from latgate.commands.sim.options import SimOptions
from latgate.commands.sim.prefix_cache import BlockCache, BlockKey


class _FifoSlots:
    """At most ``limit`` holders at once (0: no limit); the others wait in arrival order.

    A ticket is a future resolved when the slot passes to its holder; a cancelled or
    abandoned ticket leaves the queue without taking the slot.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def enter(self) -> asyncio.Future[None] | None:
        """``None`` when a slot was free (it is held now), else the ticket to await."""
        if not self.limit or (self.held < self.limit and not self.waiters):
            self.held += 1
            return None
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(ticket)
        return ticket

    def leave_queue(self, ticket: asyncio.Future[None]) -> None:
        try:
            self.waiters.remove(ticket)
        except ValueError:
            pass

    def release(self) -> None:
        """Give a held slot back: to the next live ticket in line, else free it."""
        while self.waiters:
            ticket = self.waiters.popleft()
            if not ticket.done():
                ticket.set_result(None)
                return
        self.held -= 1


class Engine:
    """The batch scheduler shared by every request of one simulator.

    Args:
        options: timing and batch size (see :class:`~latgate.commands.sim.options.SimOptions`).
        clock: time source; :class:`~latgate.commands.sim.clock.MonotonicClock` in a server.
    """

    def __init__(self, *, options: SimOptions, clock: Clock) -> None:
        self.options = options
        self.clock = clock
        self.prefix_cache = BlockCache(
            capacity_tokens=options.prefix_cache_tokens if options.prefix_cache else 0,
            block_tokens=options.prefix_cache_block_tokens,
        )
        self._batch = _FifoSlots(options.max_batch_size)
        self._prefill = _FifoSlots(options.prefill_concurrency)

    @property
    def running(self) -> int:
        """Generations holding a slot (prefilling or decoding)."""
        return self._batch.held

    @property
    def waiting(self) -> int:
        """Generations queued for a slot."""
        return len(self._batch.waiters)

    @property
    def prefilling(self) -> int:
        """Generations prefilling now."""
        return self._prefill.held

    @property
    def waiting_for_prefill(self) -> int:
        """Generations holding a slot and waiting for a prefill turn."""
        return len(self._prefill.waiters)

    def tpot_seconds(self) -> float:
        """Time per output token at the current batch size."""
        extra = max(0, self._batch.held - 1)
        return (self.options.tpot_ms + self.options.tpot_growth_ms * extra) / 1000.0

    def start(self, *, prompt_tokens: int, block_keys: Sequence[BlockKey] = ()) -> Generation:
        """Queue one request; it counts as running or waiting from this call on.

        Args:
            prompt_tokens: the prompt's length in tokens.
            block_keys: the prompt's full blocks
                (:func:`~latgate.commands.sim.prefix_cache.block_keys`): looked up in the prefix
                cache when its prefill starts (the blocks held cost no prefill time),
                held by it once prefill is done. Ignored when the cache is off.
        """
        return Generation(engine=self, prompt_tokens=prompt_tokens, block_keys=block_keys)


class Generation:
    """One request's passage through the engine (made by :meth:`Engine.start`).

    Attributes (times in seconds on the engine's clock):
        prompt_tokens: the prompt's length in tokens.
        cached_tokens: of those, served from the prefix cache (known once prefill starts).
        queued_at: when it joined.
        admitted_at: when it got a slot (``None`` before).
        prefill_started_at: when its prefill turn came (``None`` before).
        first_token_at: when its first token was due (``None`` before).
    """

    def __init__(self, *, engine: Engine, prompt_tokens: int, block_keys: Sequence[BlockKey]) -> None:
        self._engine = engine
        self._clock = engine.clock
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = 0
        self._block_keys = block_keys
        self.queued_at = self._clock.now()
        self.admitted_at: float | None = None
        self.prefill_started_at: float | None = None
        self.first_token_at: float | None = None
        self._ticket = engine._batch.enter()
        self._next_token_at = 0.0
        self._closed = False

    @property
    def queue_wait_seconds(self) -> float | None:
        """Time spent waiting for a slot (``None`` while still waiting)."""
        return None if self.admitted_at is None else self.admitted_at - self.queued_at

    @property
    def prefill_wait_seconds(self) -> float | None:
        """Time spent holding a slot, waiting for other prefills (``None`` before its turn)."""
        if self.prefill_started_at is None or self.admitted_at is None:
            return None
        return self.prefill_started_at - self.admitted_at

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
        """Wait for a slot, then for a prefill turn, then for prefill; returns when the
        first token is due. The prefill turn is given back on return or cancellation."""
        engine = self._engine
        if self._ticket is not None:
            await self._ticket
        self.admitted_at = self._clock.now()
        turn = engine._prefill.enter()
        try:
            if turn is not None:
                await turn
            self.prefill_started_at = self._clock.now()
            cache = engine.prefix_cache if engine.options.prefix_cache else None
            if cache is not None:
                self.cached_tokens = cache.lookup(self._block_keys, prompt_tokens=self.prompt_tokens)
            self._next_token_at = self.prefill_started_at + self.prefill_seconds()
            await self._clock.sleep(self._next_token_at - self._clock.now())
            self.first_token_at = self._next_token_at
            if cache is not None:
                cache.insert(self._block_keys)
        finally:
            if turn is None or (turn.done() and not turn.cancelled()):
                engine._prefill.release()
            else:
                turn.cancel()
                engine._prefill.leave_queue(turn)

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
            self._engine._batch.leave_queue(ticket)
            return
        self._engine._batch.release()
