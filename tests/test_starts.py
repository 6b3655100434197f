"""Request starts in a burst: at most a few per event-loop turn, the newest waiting
first; a request that finds no queue begins in its own turn."""

from __future__ import annotations

import asyncio

from latgate.process.starts import StartGate


def _gate(per_turn: int, began: list[int]) -> StartGate:
    async def app(scope, receive, send) -> None:
        began.append(scope["index"])

    return StartGate(app, per_turn=per_turn)


def test_a_request_that_finds_no_queue_begins_without_waiting_a_turn() -> None:
    async def main() -> bool:
        gate = _gate(4, [])
        turned = False

        def mark() -> None:
            nonlocal turned
            turned = True

        asyncio.get_running_loop().call_soon(mark)
        await gate({"type": "http", "index": 0}, None, None)
        return turned

    assert asyncio.run(main()) is False


def test_a_burst_begins_per_turn_and_the_newest_waiting_first() -> None:
    async def main() -> list[list[int]]:
        began: list[int] = []
        gate = _gate(4, began)
        tasks = [asyncio.create_task(gate({"type": "http", "index": i}, None, None)) for i in range(12)]
        turns: list[list[int]] = []
        seen = 0
        while len(began) < 12:
            await asyncio.sleep(0)
            if len(began) > seen:
                turns.append(began[seen:])
                seen = len(began)
        await asyncio.gather(*tasks)
        assert gate.waiting == 0
        return turns

    turns = asyncio.run(main())
    assert all(len(turn) <= 4 for turn in turns)
    assert turns[0] == [0, 1, 2, 3]  # room in their own turn: in arrival order
    assert sorted(i for turn in turns[1:] for i in turn) == list(range(4, 12))
    assert turns[1][0] == 11  # then the newest waiting first


def test_a_request_cancelled_while_waiting_leaves_the_queue() -> None:
    async def main() -> tuple[int, int, list[int]]:
        began: list[int] = []
        gate = _gate(1, began)
        first = asyncio.create_task(gate({"type": "http", "index": 0}, None, None))
        held = asyncio.create_task(gate({"type": "http", "index": 1}, None, None))
        other = asyncio.create_task(gate({"type": "http", "index": 2}, None, None))
        await asyncio.sleep(0)
        waiting_before = gate.waiting
        held.cancel()
        await asyncio.gather(first, other, held, return_exceptions=True)
        return waiting_before, gate.waiting, began

    waiting_before, waiting_after, began = asyncio.run(main())
    assert waiting_before == 2
    assert waiting_after == 0
    assert began == [0, 2]


def test_lifespan_passes_straight_through() -> None:
    async def main() -> list[str]:
        seen: list[str] = []

        async def app(scope, receive, send) -> None:
            seen.append(scope["type"])

        gate = StartGate(app, per_turn=1)
        await asyncio.gather(*(gate({"type": "lifespan"}, None, None) for _ in range(3)))
        return seen

    assert asyncio.run(main()) == ["lifespan"] * 3
