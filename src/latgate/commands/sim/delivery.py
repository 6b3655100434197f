"""Writing a simulated reply on the engine's schedule: an SSE stream one chunk per
token, or a whole JSON body at the end, with the faults planned for it (a stall, a
dropped connection) applied on the way (:mod:`latgate.commands.sim.faults`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from latgate.commands.sim import wire
from latgate.commands.sim.asgi import JSON_HEADERS, SSE_HEADERS, Outcome, Scope, Send, request_id, send_bytes
from latgate.commands.sim.engine import Generation
from latgate.commands.sim.faults import FaultPlan
from latgate.commands.sim.stats import SimStats


@dataclass(frozen=True, slots=True)
class Faults:
    """One reply's planned faults, counted in ``stats``; a stall lasts ``stall_ms``."""

    plan: FaultPlan
    stats: SimStats
    stall_ms: float

    async def before(self, index: int, generation: Generation) -> bool:
        """Apply a stall due before step ``index``; True when the connection must drop there."""
        if index == self.plan.stall_before_step:
            self.stats.stalls += 1
            await generation.pause(self.stall_ms / 1000.0)
        if index == self.plan.drop_before_step:
            self.stats.drops += 1
            return True
        return False


async def stream_reply(
    scope: Scope,
    send: Send,
    generation: Generation,
    rendered: Callable[[], wire.StreamPlan | bytes],
    faults: Faults,
) -> Outcome:
    """Stream ``rendered()``'s SSE chunks, one per token on the engine's schedule."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + request_id(scope)})
    await generation.first_token()
    stream = rendered()
    assert isinstance(stream, wire.StreamPlan)
    last = len(stream.steps)
    for index in range(last + 1):
        if 0 < index < last:
            await generation.next_token()
        if await faults.before(index, generation):
            return Outcome.DROPPED
        body = stream.tail if index == last else stream.steps[index]
        await send({"type": "http.response.body", "body": body, "more_body": index < last})
    return Outcome.COMPLETED


async def whole_reply(
    scope: Scope,
    send: Send,
    generation: Generation,
    rendered: Callable[[], wire.StreamPlan | bytes],
    steps: int,
    faults: Faults,
) -> Outcome:
    """Send ``rendered()``'s JSON body once every one of ``steps`` tokens is generated."""
    await generation.first_token()
    body = rendered()
    assert isinstance(body, bytes)
    for index in range(1, steps + 1):
        if index < steps:
            await generation.next_token()
        if await faults.before(index, generation):
            # Headers and half the body, then the connection closes (the ASGI server
            # closes it when the app returns with the response incomplete).
            start = {"type": "http.response.start", "status": 200}
            start["headers"] = JSON_HEADERS + [(b"content-length", str(len(body)).encode())]
            await send(start)
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            return Outcome.DROPPED
    await send_bytes(send, 200, body, headers=JSON_HEADERS + request_id(scope))
    return Outcome.COMPLETED
