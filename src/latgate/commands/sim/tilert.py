"""The simulator's ``tilert`` profile: TileRT's prefill/decode router, as its source says
it behaves (``tilert/pd_vllm/pd_router.py``, tile-ai/TileRT v0.1.5).

Routes, exactly these (anything else is FastAPI's 404 ``{"detail": "Not Found"}``):

- ``POST /v1/chat/completions``, streamed or not; ``POST /v1/completions``, not
  streamed: a streamed one is 400 ``{"error": "streaming is supported on
  /v1/chat/completions"}``.
- ``GET /health`` -> ``{"status": "ok", "decode_free": N}``; ``GET /pool_status`` ->
  ``{"nodes": [{"host": ..., "busy": ...}, ...]}``. No ``/v1/models``, no ``/metrics``.

Capacity is one request per decode node (``decode_nodes``), held from arrival to the
end of the answer; with every node busy the answer is 429 ``{"error": "all decode nodes
busy"}`` at once (TileRT has no queue). Timing: prefill (``ttft_overhead_ms`` plus the
prompt at ``prefill_tokens_per_second``, vLLM-like) ends with the role chunk; then one
token every ``tpot_ms`` on the node, whatever the other nodes do. Faults: ``error_rate``
is a prefill failure (502 ``{"error": ...}``); ``decode_error_rate`` writes
``[decode error: ...]`` into the answer after ``decode_error_after_tokens`` tokens;
``drop_rate`` is an exception mid-stream, which TileRT answers by ending the stream with
neither a finish chunk nor ``[DONE]`` (a non-streamed one gets a 502); ``stall_rate``
pauses. A client that goes away frees its node at once. Shapes:
:mod:`latgate.commands.sim.tilert_wire`.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import time
import uuid
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import orjson

from latgate.commands.sim import replies
from latgate.commands.sim.asgi import (
    JSON_HEADERS,
    Outcome,
    Receive,
    Scope,
    Send,
    read_body,
    send_bytes,
    serve_non_http,
    until_disconnect,
)
from latgate.commands.sim.clock import Clock
from latgate.commands.sim.engine import Engine, Generation
from latgate.commands.sim.faults import FaultInjector, FaultPlan
from latgate.commands.sim.options import SimOptions
from latgate.commands.sim.stats import SimStats
from latgate.commands.sim.tilert_wire import (
    BUSY_MESSAGE,
    STREAMED_COMPLETIONS_MESSAGE,
    Chunks,
    answer_body,
    compact,
    error_body,
)
from latgate.foundation.errors import InvalidRequest
from latgate.routing.tokens import estimate_prompt_tokens

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
DECODE_ERROR_MESSAGE = "decode node failed (injected fault)"
TILERT_DEFAULTS = SimOptions(
    profile="tilert",
    ttft_overhead_ms=20.0,
    prefill_tokens_per_second=20_000.0,
    tpot_ms=2.5,
    tpot_growth_ms=0.0,
    decode_nodes=8,
)
"""``latgate sim --profile tilert``'s defaults: a vLLM-like prefill (20 ms plus 20 000
prompt tokens/s), then 400 tokens/s per decode node."""


class TileRtApp:
    """A simulated TileRT PD router (ASGI 3); built by
    :func:`~latgate.commands.sim.app.create_sim_app` for ``profile="tilert"``.

    Attributes:
        options: its :class:`~latgate.commands.sim.options.SimOptions`.
        busy: one flag per decode node.
        engine: the timing model (a :class:`~latgate.commands.sim.engine.Engine` with one slot
            per node, which never queues: a request finding no free node is refused).
        stats: its :class:`~latgate.commands.sim.stats.SimStats` (``busy_rejections`` and
            ``decode_errors`` too); also ``state.sim``.
        paths: ``(method, path)`` of every HTTP request received, with counts.
    """

    def __init__(self, *, options: SimOptions, clock: Clock) -> None:
        self.options = options
        self.busy = [False] * options.decode_nodes
        self.paths: collections.Counter[tuple[str, str]] = collections.Counter()
        timing = dataclasses.replace(options, max_batch_size=options.decode_nodes, tpot_growth_ms=0.0)
        self.engine = Engine(options=timing, clock=clock)
        self.stats = SimStats()
        self.state = SimpleNamespace(sim=self.stats, engine=self.engine, options=options)
        self._clock = clock
        self._faults = FaultInjector(options=options)
        self._decode_errors = random.Random(options.seed)
        self._seed_bytes = str(options.seed or 0).encode()
        self._routes = {
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/completions": ("POST", self._completions),
            "/health": ("GET", self._health),
            "/pool_status": ("GET", self._pool_status),
        }

    @property
    def decode_free(self) -> int:
        """Decode nodes free now."""
        return self.busy.count(False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await serve_non_http(scope, receive, send):
            return
        self.paths[(scope["method"], scope["path"])] += 1
        route = self._routes.get(scope["path"])
        if route is None:
            await send_bytes(send, 404, b'{"detail":"Not Found"}', headers=JSON_HEADERS)
        elif scope["method"] != route[0]:
            await send_bytes(send, 405, b'{"detail":"Method Not Allowed"}', headers=JSON_HEADERS)
        else:
            await route[1](scope, receive, send)

    # -- plain endpoints -----------------------------------------------------------

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, compact({"status": "ok", "decode_free": self.decode_free}), headers=JSON_HEADERS)

    async def _pool_status(self, scope: Scope, receive: Receive, send: Send) -> None:
        nodes = [{"host": f"decode-{index}", "busy": busy} for index, busy in enumerate(self.busy)]
        await send_bytes(send, 200, compact({"nodes": nodes}), headers=JSON_HEADERS)

    # -- generation ----------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generation(scope, receive, send, chat=True)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generation(scope, receive, send, chat=False)

    async def _generation(self, scope: Scope, receive: Receive, send: Send, *, chat: bool) -> None:
        self.stats.request_started()
        outcome: Outcome | None = None
        node: int | None = None
        try:
            raw = await read_body(receive)
            if raw is None:
                outcome = Outcome.DISCONNECTED
                return
            body = self._parse(scope, raw)
            if body is None:
                await _error(send, 400, "the request body must be a JSON object")
                return
            stream = body.get("stream") is True
            if stream and not chat:
                await _error(send, 400, STREAMED_COMPLETIONS_MESSAGE)
                return
            node = self._acquire()
            if node is None:
                self.stats.busy_rejections += 1
                await _error(send, 429, BUSY_MESSAGE)
                return
            outcome = await self._answer(scope, receive, send, body, chat=chat, stream=stream)
        finally:
            if node is not None:
                self.busy[node] = False
            self.stats.request_ended(outcome)

    def _acquire(self) -> int | None:
        for index, busy in enumerate(self.busy):
            if not busy:
                self.busy[index] = True
                return index
        return None

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send, body: dict[str, Any], *, chat: bool, stream: bool
    ) -> Outcome | None:
        model = given if isinstance(given := body.get("model"), str) else self.options.default_model
        if self.options.models and model not in self.options.models:
            await _error(send, 502, f"prefill failed: model {model!r} is not served")  # vLLM's 404, re-raised
            return None
        try:
            plan = self._plan(body, chat=chat)
        except InvalidRequest as error:
            await _error(send, 502, f"prefill failed: {error.message}")  # vLLM's 400, re-raised
            return None
        prompt_tokens = estimate_prompt_tokens(body)
        chunks = Chunks(
            id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=model,
            prompt_tokens=prompt_tokens,
        )
        fault = self._faults.plan(steps=plan.completion_tokens)
        decode_error = self._decode_errors.random() < self.options.decode_error_rate
        generation = self.engine.start(prompt_tokens=prompt_tokens)
        try:
            if stream:
                work = self._stream(send, generation, plan, chunks, fault, decode_error=decode_error)
            else:
                work = self._respond(send, generation, plan, chunks, fault, chat=chat)
            outcome = await until_disconnect(receive, work)
        finally:
            generation.close()
        if outcome is Outcome.COMPLETED:
            self.stats.prompt_tokens_total += prompt_tokens
            self.stats.completion_tokens_total += plan.completion_tokens
        return outcome

    def _plan(self, body: dict[str, Any], *, chat: bool) -> replies.ChoicePlan:
        single = {**body, "n": 1}  # TileRT answers one choice
        seed = self._seed_bytes + orjson.dumps(body.get("messages") if chat else body.get("prompt"))
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, Mapping) for m in messages):
                raise InvalidRequest("messages must be a non-empty list of message objects")
            plans = replies.plan_chat(
                single,
                rng_seed=seed,
                default_max_tokens=self.options.default_max_tokens,
                max_output_tokens=self.options.max_output_tokens,
                preferred_tools=self.options.preferred_tools,
            )
        else:
            plans = replies.plan_text(
                rng_seed=seed,
                n=1,
                max_tokens=replies.requested_max_tokens(single),
                default_max_tokens=self.options.default_max_tokens,
                max_output_tokens=self.options.max_output_tokens,
            )
        return plans[0]

    async def _stream(
        self, send: Send, generation: Generation, plan: replies.ChoicePlan, chunks: Chunks, fault: FaultPlan, *, decode_error: bool
    ) -> Outcome:
        await generation.first_token()  # prefill done: TileRT starts its response with the role chunk
        if fault.error:
            self.stats.errors_injected += 1
            await _error(send, 502, "prefill failed (injected fault)")
            return Outcome.DROPPED
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body", "body": chunks.role(), "more_body": True})
        steps = chunks.steps(plan)
        error_at = min(self.options.decode_error_after_tokens, len(steps)) if decode_error else None
        for index, step in enumerate(steps, start=1):
            if index - 1 == error_at:
                break
            await generation.next_token()
            if index == fault.stall_before_step:
                self.stats.stalls += 1
                await generation.pause(self.options.stall_ms / 1000.0)
            if index == fault.drop_before_step:  # an exception after streaming began: the stream just ends
                self.stats.drops += 1
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return Outcome.DROPPED
            if step:
                await send({"type": "http.response.body", "body": step, "more_body": True})
        if error_at is not None:
            self.stats.decode_errors += 1
            tail = chunks.decode_error(DECODE_ERROR_MESSAGE) + chunks.finish(finish_reason="stop", completion_tokens=error_at)
        else:
            tail = chunks.finish(finish_reason=plan.finish_reason, completion_tokens=plan.completion_tokens)
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return Outcome.COMPLETED

    async def _respond(
        self, send: Send, generation: Generation, plan: replies.ChoicePlan, chunks: Chunks, fault: FaultPlan, *, chat: bool
    ) -> Outcome:
        started = self._clock.now()
        await generation.first_token()
        prefilled = self._clock.now()
        if fault.error:
            self.stats.errors_injected += 1
            await _error(send, 502, "prefill failed (injected fault)")
            return Outcome.DROPPED
        for index in range(1, plan.completion_tokens + 1):
            await generation.next_token()
            if index == fault.drop_before_step:
                self.stats.drops += 1
                await _error(send, 502, DECODE_ERROR_MESSAGE)
                return Outcome.DROPPED
        done = self._clock.now()
        data = answer_body(
            plan, chunks, chat=chat, prefill_ms=(prefilled - started) * 1000.0, decode_ms=(done - prefilled) * 1000.0
        )
        await send_bytes(send, 200, data, headers=JSON_HEADERS)
        return Outcome.COMPLETED

    def _parse(self, scope: Scope, raw: bytes) -> dict[str, Any] | None:
        body = self.stats.record_request(scope, raw)
        return body if isinstance(body, dict) else None


async def _error(send: Send, status: int, message: str) -> None:
    await send_bytes(send, status, error_body(message), headers=JSON_HEADERS)
