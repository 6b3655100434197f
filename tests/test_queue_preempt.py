"""Preemption before the first byte on plain data and an injected clock: who preempts
whom on a full pool, that the slot goes to the request that preempted, and the hold of
a flood's stream (:mod:`latgate.routing.queue_preempt`; end to end: test_queue_e2e.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from clocks import ManualClock

from latgate.forwarding.keepalive import EarlyHead
from latgate.foundation.config import load_config_text
from latgate.foundation.errors import Overloaded
from latgate.foundation.metrics import Metrics
from latgate.live.providers import ProviderPool
from latgate.routing.admission import Admission, Ask
from latgate.routing.decision import Router
from latgate.routing.priority import BATCH, INTERACTIVE
from latgate.routing.queue_preempt import Preempted, Preemptible

POOL = """
[providers.vllm]
api_base = "http://127.0.0.1:9/v1"
models = ["m"]
max_batch_size = 4

[routing]
default_route = "vllm"
"""
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Full:
    """A 4-slot pool (one slot of batch headroom) with the gateway queue on a manual clock."""

    def __init__(self) -> None:
        config = load_config_text(POOL, source="test.toml")
        self.clock = ManualClock(0.0)
        metrics = Metrics(providers=config.providers, models=["m"])
        self.pool = ProviderPool(config, metrics=metrics, env={}, clock=self.clock)
        self.admission = Admission(
            pool=self.pool, metrics=metrics, settings=config.routing.queue, enabled=True, timer=self.clock
        )
        self.runtime = self.pool["vllm"]
        self.endpoint = self.runtime.endpoints[0]
        self.admission.outlook.leases[self.endpoint.key] = 0.7  # as if observed: a request holds a slot 700 ms
        self.router = Router(config)
        self.guard = self.admission.guard("vllm", BATCH)
        assert self.guard is not None

    async def hold(self, priority: int, tenant: str) -> Any:
        """The decision after the queue for a request of ``tenant`` arriving now; it then
        takes its slot (as its attempt does, until the test ends)."""
        held, _ = await self.admission.hold(self.router.decide(BODY, {}), Ask(priority, tenant, self.clock(), 100))
        self.pool.begin(self.runtime, self.endpoint)
        return held

    def attempt(self, tenant: str, *, stream: bool = False) -> tuple[asyncio.Future[Any], SimpleNamespace]:
        """A ``batch`` attempt of ``tenant`` holding a slot until it is cut (as an attempt's
        ticket does: begun when sent, ended when it unwinds), started now under the guard."""
        exchange = SimpleNamespace(tenant=tenant, stream=stream, queue_outcome=None)

        async def running() -> None:
            ticket = self.pool.begin(self.runtime, self.endpoint)
            try:
                await asyncio.Event().wait()
            finally:
                self.pool.end(self.runtime, self.endpoint, ticket)

        return asyncio.ensure_future(self.guard.run(running(), exchange)), exchange


async def settle() -> None:
    """Let every ready task run (a cut attempt unwinds, its slot goes to the next)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def flood_full(full: Full) -> tuple[list[asyncio.Future[Any]], list[asyncio.Future[Any]]]:
    """The flood's attempts in every slot (started 1 s apart) and two of its requests waiting."""
    attempts = []
    for _ in range(4):
        attempts.append(full.attempt("flood")[0])
        await settle()
        full.clock.now += 1.0
    waiting = [asyncio.ensure_future(full.hold(BATCH, "flood")) for _ in range(2)]
    await settle()
    assert full.admission.describe()["vllm"]["waiting"] == 2
    return attempts, waiting


def test_an_interactive_request_on_a_full_pool_takes_the_youngest_batch_attempts_slot_at_once() -> None:
    full = Full()

    async def main() -> None:
        attempts, waiting = await flood_full(full)
        interactive = asyncio.ensure_future(full.hold(INTERACTIVE, "quiet"))
        await settle()
        assert interactive.done(), "it did not wait for a slot to free"
        assert interactive.result().reason == "waited:vllm"
        assert [a.done() for a in attempts] == [False, False, False, True], "the youngest was cut"
        with pytest.raises(Preempted) as cut:
            attempts[3].result()
        assert cut.value.headers == {"retry-after": "1", "x-latgate-preempted": "1"}
        assert not any(w.done() for w in waiting), "the freed slot went to the interactive request, not the queue"
        assert full.admission.describe()["vllm"]["preempted"] == 1
        for task in attempts + waiting:
            task.cancel()
        await asyncio.gather(*attempts, *waiting, return_exceptions=True)

    asyncio.run(main())


def test_a_quiet_keys_batch_requests_within_their_share_preempt_the_flood_and_the_one_past_it_waits_its_turn() -> None:
    full = Full()

    async def main() -> None:
        attempts, waiting = await flood_full(full)
        # two keys on 4 slots: the quiet key's share is 2 slots' worth of requests ahead of the flood's service
        taken = [asyncio.ensure_future(full.hold(BATCH, "quiet")) for _ in range(2)]
        await settle()
        assert all(t.done() and t.result().reason == "waited:vllm" for t in taken), "its share was unused: the flood gave slots"
        assert sum(a.done() for a in attempts) == 2
        third = asyncio.ensure_future(full.hold(BATCH, "quiet"))
        await settle()
        assert not third.done(), "past its share: it waits in the queue like the flood"
        assert sum(a.done() for a in attempts) == 2
        for task in [*attempts, *waiting, third]:
            task.cancel()
        await asyncio.gather(*attempts, *waiting, third, return_exceptions=True)

    asyncio.run(main())


@pytest.mark.parametrize("stream", [True, False], ids=["before-its-first-content", "non-streamed"])
def test_the_batch_headroom_is_left_free_unless_a_running_batch_attempt_would_give_its_slot_up_at_once(stream: bool) -> None:
    full = Full()

    async def main() -> None:
        attempts = []
        for _ in range(3):  # one slot left: the headroom
            attempts.append(full.attempt("flood", stream=stream)[0])
            await settle()
        batch = asyncio.ensure_future(full.hold(BATCH, "flood"))
        await settle()
        assert batch.done() is not stream, "a stream before its content would drain its slot: the headroom is kept"
        for task in [*attempts, batch]:
            task.cancel()
        await asyncio.gather(*attempts, batch, return_exceptions=True)

    asyncio.run(main())


def test_without_a_backlog_elsewhere_a_batch_request_preempts_nobody() -> None:
    full = Full()

    async def main() -> None:
        attempts = []
        for _ in range(4):
            attempts.append(full.attempt("flood")[0])
            await settle()
        quiet = asyncio.ensure_future(full.hold(BATCH, "quiet"))
        await settle()
        assert not quiet.done() and not any(a.done() for a in attempts), "the flood asks no more than it is served"
        for task in [*attempts, quiet]:
            task.cancel()
        await asyncio.gather(*attempts, quiet, return_exceptions=True)

    asyncio.run(main())


def test_a_batch_stream_whose_head_went_out_with_keepalives_is_not_preempted() -> None:
    async def main() -> None:
        cut: list[int] = []
        guard = Preemptible("vllm", lambda: cut.append(1))
        sent, waiting = EarlyHead(), EarlyHead()
        sent.commit()  # its 200 head and keep-alives reached the client
        streaming = SimpleNamespace(tenant="flood", stream=True, queue_outcome=None)
        held = SimpleNamespace(tenant="flood", stream=True, queue_outcome=None)
        first = asyncio.ensure_future(guard.run(asyncio.Event().wait(), streaming, sent))
        await settle()
        assert not guard.preempt(priority=INTERACTIVE, tenant="quiet", backlogged=()), "the client has its head: never cut"
        second = asyncio.ensure_future(guard.run(asyncio.Event().wait(), held, waiting))
        await settle()
        assert guard.preempt(priority=INTERACTIVE, tenant="quiet", backlogged=())
        with pytest.raises(Preempted):
            await second
        assert held.queue_outcome == "preempted" and streaming.queue_outcome is None and cut == [1]
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)

    asyncio.run(main())


class Relay:
    """A stream's relay as the attempt hands it over (head, tap, body, on_close, abort), its
    upstream body fed by the test; ``b"[DONE]"`` ends it."""

    def __init__(self) -> None:
        self.head = b"first "
        self.head_units = 1
        self.reads: asyncio.Queue[bytes] = asyncio.Queue()
        self.tap = SimpleNamespace(done=False, error=None, feed=self._feed)
        self.body = self
        self.aborted = self.closed = False

    def _feed(self, data: bytes) -> tuple[bytes, int]:
        self.tap.done = data == b"[DONE]"
        return data, 0 if self.tap.done else 1

    def __aiter__(self) -> Relay:
        return self

    async def __anext__(self) -> bytes:
        return await self.reads.get()

    def abort(self) -> None:
        self.aborted = True

    async def on_close(self) -> None:
        self.closed = True


def test_a_flood_stream_is_held_to_its_end_and_a_quiet_ones_goes_at_once() -> None:
    async def main() -> None:
        guard = Preemptible("vllm", lambda: None, hold_seconds=lambda tenant: 60.0 if tenant == "flood" else 0.0)
        relays = {"flood": Relay(), "quiet": Relay()}

        async def sent(relay: Relay) -> Relay:
            return relay

        flood = asyncio.ensure_future(guard.run(sent(relays["flood"]), SimpleNamespace(tenant="flood", stream=True)))
        quiet = asyncio.ensure_future(guard.run(sent(relays["quiet"]), SimpleNamespace(tenant="quiet", stream=True)))
        await settle()
        assert quiet.done() and quiet.result().head == b"first ", "no backlog: streamed as it comes"
        relays["flood"].reads.put_nowait(b"second ")
        await settle()
        assert not flood.done(), "nothing reached the flood's client: still preemptible"
        relays["flood"].reads.put_nowait(b"[DONE]")
        await settle()
        assert flood.done() and flood.result().head == b"first second [DONE]", "its whole stream, as one head"
        assert flood.result().head_units == 2

    asyncio.run(main())


def test_a_held_stream_preempted_closes_its_upstream_connection_and_is_never_sent() -> None:
    async def main() -> None:
        guard = Preemptible("vllm", lambda: None, hold_seconds=lambda tenant: 60.0)
        relay = Relay()
        exchange = SimpleNamespace(tenant="flood", stream=True, queue_outcome=None)

        async def sent() -> Relay:
            return relay

        held = asyncio.ensure_future(guard.run(sent(), exchange))
        await settle()
        assert len(guard) == 1
        assert guard.preempt(priority=INTERACTIVE, tenant="quiet", backlogged={"flood"})
        await settle()
        with pytest.raises(Preempted):
            held.result()
        assert relay.aborted and relay.closed, "the engine sees the disconnect at once; the slot is released"
        assert exchange.queue_outcome == "preempted" and len(guard) == 0

    asyncio.run(main())


def test_a_preempted_request_the_queue_would_shed_gets_its_503_saying_so_and_counts_no_shed() -> None:
    full = Full()

    async def main() -> None:
        attempts, waiting = await flood_full(full)
        # cut 11 s after it arrived: past batch_max_wait_ms (10 s), as the hold bounds any request
        late = Ask(BATCH, "flood", full.clock() - 11.0, 100, preempted=True)
        with pytest.raises(Preempted) as refused:
            await full.admission.hold(full.router.decide(BODY, {}), late)
        assert refused.value.status == 503 and refused.value.headers["x-latgate-preempted"] == "1"
        assert int(refused.value.headers["retry-after"]) >= 1 and "cannot wait again" in refused.value.message
        assert (full.admission.describe()["vllm"]["shed"], full.admission.describe()["vllm"]["waiting"]) == (0, 2)
        # the same request not preempted is shed as ever
        with pytest.raises(Overloaded) as shed:
            await full.admission.hold(full.router.decide(BODY, {}), Ask(BATCH, "flood", full.clock() - 11.0, 100))
        assert not isinstance(shed.value, Preempted) and shed.value.code == "queue_full"
        for task in attempts + waiting:
            task.cancel()
        await asyncio.gather(*attempts, *waiting, return_exceptions=True)

    asyncio.run(main())
