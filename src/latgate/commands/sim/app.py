"""The simulator's HTTP face: a plain ASGI 3 app, cheap per request and per chunk.

Routes (each also without the ``/v1`` prefix): ``POST /v1/chat/completions``,
``POST /v1/completions``, ``POST /v1/embeddings``, ``POST /v1/responses`` (see
:mod:`latgate.commands.sim.responses`), ``GET /v1/models``, ``GET /health``, ``GET /metrics``. Errors use the OpenAI envelope (:mod:`latgate.foundation.errors`).

Streaming writes the precomputed bytes of :mod:`latgate.commands.sim.wire` with one ``send`` per
token while a second task listens for ``http.disconnect``: when the client goes away
the reply stops at once, leaves the engine, and ``app.state.sim.disconnects`` counts it.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from types import SimpleNamespace
from typing import Any

import orjson

from latgate.commands.sim import embeddings, replies, wire
from latgate.commands.sim.asgi import (
    JSON_HEADERS,
    Outcome,
    Receive,
    Scope,
    Send,
    read_body,
    request_id,
    send_bytes,
    serve_non_http,
    until_disconnect,
)
from latgate.commands.sim.clock import Clock, MonotonicClock
from latgate.commands.sim.delivery import Faults, stream_reply, whole_reply
from latgate.commands.sim.engine import Engine, Generation
from latgate.commands.sim.faults import FaultInjector
from latgate.commands.sim.options import SimOptions
from latgate.commands.sim.prefix_cache import BlockKey, block_keys, prefix_digests
from latgate.commands.sim.replies import ChoicePlan
from latgate.commands.sim.responses import ResponsesSend
from latgate.commands.sim.stats import SimStats, prometheus_text
from latgate.commands.sim.tilert import TileRtApp
from latgate.foundation.errors import GatewayError, InvalidRequest, NotFound, RateLimited
from latgate.request.translate.responses_request import responses_to_chat
from latgate.request.translate.responses_stream import ResponsesStreamTransform
from latgate.routing.tokens import REPLY_PRIMER_TOKENS, estimate_prompt_tokens


class _MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


def create_sim_app(options: SimOptions, *, clock: Clock | None = None) -> SimApp | TileRtApp:
    """Build one simulated engine as an ASGI app (TileRT's router for
    ``options.profile == "tilert"``, see :mod:`latgate.commands.sim.tilert`).

    Args:
        options: timing, limits and faults (:class:`~latgate.commands.sim.options.SimOptions`).
        clock: time source; default the real monotonic clock.

    Returns:
        A :class:`SimApp`; ``app.state.sim`` holds its :class:`~latgate.commands.sim.stats.SimStats`
        and ``app.engine`` its scheduler. Example::

            with serve_app(create_sim_app(SimOptions(models=("m",)))) as base_url:
                httpx.post(base_url + "/v1/chat/completions", json={...})
    """
    if options.profile == "tilert":
        return TileRtApp(options=options, clock=clock or MonotonicClock())
    return SimApp(options=options, clock=clock or MonotonicClock())


class SimApp:
    """An OpenAI-compatible simulated engine (ASGI 3); build it with :func:`create_sim_app`.

    Attributes:
        options: the :class:`~latgate.commands.sim.options.SimOptions` it runs with.
        engine: its :class:`~latgate.commands.sim.engine.Engine` (``running`` / ``waiting``).
        stats: its :class:`~latgate.commands.sim.stats.SimStats` (counters, recent requests,
            ``disconnected_event``); also reachable as ``state.sim``, Starlette-style.
    """

    def __init__(self, *, options: SimOptions, clock: Clock) -> None:
        self.options = options
        self.engine = Engine(options=options, clock=clock)
        self.stats = SimStats()
        self.state = SimpleNamespace(sim=self.stats, engine=self.engine, options=options)
        self._faults = FaultInjector(options=options)
        self._seed = options.seed or 0
        self._seed_bytes = str(self._seed).encode()
        self._started_at = int(time.time())
        self._routes: dict[str, tuple[str, Callable[[Scope, Receive, Send], Awaitable[None]]]] = {
            "/chat/completions": ("POST", self._chat),
            "/completions": ("POST", self._completions),
            "/embeddings": ("POST", self._embeddings),
            "/responses": ("POST", self._responses),
            "/models": ("GET", self._models),
            "/health": ("GET", self._health),
            "/metrics": ("GET", self._metrics),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await serve_non_http(scope, receive, send):
            return
        path = scope["path"].rstrip("/")
        version = path.find("/v1/")
        if version >= 0:  # "/v1/models", and behind a prefix as hosted upstreams have ("/api/v1/...")
            path = path[version + 3 :]
        try:
            route = self._routes.get(path)
            if route is None:
                raise NotFound(f"no route {scope['method']} {scope['path']}")
            if scope["method"] != route[0]:
                raise _MethodNotAllowed(f"{scope['path']} accepts {route[0]} only")
            await route[1](scope, receive, send)
        except GatewayError as error:
            headers = [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
            await send_bytes(send, error.status, error.body(), headers=JSON_HEADERS + headers)

    # -- generation endpoints ------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generation_request(
            scope, receive, send, lambda body: self._chat_reply(scope, receive, send, body)
        )

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def reply(body: dict[str, Any]) -> Outcome:
            translation = responses_to_chat(body)
            transform = ResponsesStreamTransform(echo=translation.echo, namespaced=translation.namespaced)
            return await self._chat_reply(
                scope, receive, ResponsesSend(send, transform), translation.chat_body
            )

        await self._generation_request(scope, receive, send, reply)

    async def _chat_reply(self, scope: Scope, receive: Receive, send: Send, body: dict[str, Any]) -> Outcome:
        model = self._model(body)
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, Mapping) for m in messages)
        ):
            raise InvalidRequest("messages must be a non-empty list of message objects", param="messages")
        tools = body.get("tools")
        digests = prefix_digests(messages, context=tools)
        plans = replies.plan_chat(
            body,
            rng_seed=self._seed_bytes + digests[-1],
            default_max_tokens=self.options.default_max_tokens,
            max_output_tokens=self.options.max_output_tokens,
            preferred_tools=self.options.preferred_tools,
        )
        prompt_tokens = estimate_prompt_tokens(body)
        keys: list[BlockKey] = []
        if self.options.prefix_cache:
            # the tools lead the rendered prompt (chat templates put them in the system turn)
            segment_tokens = [estimate_prompt_tokens({"messages": [m]}) - REPLY_PRIMER_TOKENS for m in messages]
            if tools:
                segment_tokens[0] += estimate_prompt_tokens({"tools": tools})
            keys = self._block_keys(digests, segment_tokens, prompt_tokens)
        envelope = self._envelope("chatcmpl", body, model=model, prompt_tokens=prompt_tokens)
        generation = self.engine.start(prompt_tokens=prompt_tokens, block_keys=keys)
        render = wire.chat_stream if wants_stream(body) else wire.chat_body
        return await self._generate(scope, receive, send, generation, plans, render, envelope)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def reply(body: dict[str, Any]) -> Outcome:
            model = self._model(body)
            prompt = body.get("prompt")
            if not isinstance(prompt, (str, list)) or not prompt:
                raise InvalidRequest("prompt must be a non-empty string or list", param="prompt")
            digests = prefix_digests([prompt])
            plans = replies.plan_text(
                rng_seed=self._seed_bytes + digests[-1],
                n=replies.choice_count(body),
                max_tokens=replies.requested_max_tokens(body),
                default_max_tokens=self.options.default_max_tokens,
                max_output_tokens=self.options.max_output_tokens,
            )
            prompt_tokens = estimate_prompt_tokens(body)
            keys = self._block_keys(digests, [prompt_tokens], prompt_tokens) if self.options.prefix_cache else []
            envelope = self._envelope("cmpl", body, model=model, prompt_tokens=prompt_tokens)
            generation = self.engine.start(prompt_tokens=prompt_tokens, block_keys=keys)
            render = wire.completion_stream if wants_stream(body) else wire.completion_body
            return await self._generate(scope, receive, send, generation, plans, render, envelope)

        await self._generation_request(scope, receive, send, reply)

    async def _embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def reply(body: dict[str, Any]) -> Outcome:
            model = self._model(body)
            items = body.get("input")
            if isinstance(items, str) or (isinstance(items, list) and items and isinstance(items[0], int)):
                items = [items]
            if not isinstance(items, list) or not items or not all(isinstance(i, (str, list)) for i in items):
                raise InvalidRequest(
                    "input must be a string, a list of strings or token lists", param="input"
                )
            dimensions = body.get("dimensions") or embeddings.DEFAULT_DIMENSIONS
            if not isinstance(dimensions, int) or not 1 <= dimensions <= embeddings.MAX_DIMENSIONS:
                raise InvalidRequest("dimensions must be an integer between 1 and 4096", param="dimensions")
            encoding = body.get("encoding_format") or "float"
            if encoding not in ("float", "base64"):
                raise InvalidRequest("encoding_format must be 'float' or 'base64'", param="encoding_format")
            data = []
            for index, item in enumerate(items):
                vector = embeddings.embedding_vector(item, seed=self._seed, dimensions=dimensions)
                value = embeddings.encode_base64(vector) if encoding == "base64" else vector
                data.append({"object": "embedding", "index": index, "embedding": value})
            prompt_tokens = estimate_prompt_tokens(body)
            self.stats.prompt_tokens_total += prompt_tokens
            usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
            payload = {"object": "list", "data": data, "model": model, "usage": usage}
            await send_bytes(send, 200, orjson.dumps(payload), headers=JSON_HEADERS + request_id(scope))
            return Outcome.COMPLETED

        await self._generation_request(scope, receive, send, reply)

    async def _generation_request(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        reply: Callable[[dict[str, Any]], Awaitable[Outcome]],
    ) -> None:
        """Count, parse and answer one generation request; a disconnect is counted after cleanup."""
        self.stats.request_started()
        outcome = None
        try:
            raw = await read_body(receive)
            if raw is None:
                outcome = Outcome.DISCONNECTED
                return
            body = self._parse(scope, raw)
            outcome = await reply(body)
        finally:
            self.stats.request_ended(outcome)


    def set_faults(self, *, error_rate: float) -> None:
        """From the next request on, answer this share of requests with a 500 (as
        ``SimOptions.error_rate``), the other faults unchanged: a replica that fails for
        a while, then recovers (tests, benchmarks)."""
        self.options = dataclasses.replace(self.options, error_rate=error_rate)
        self._faults = FaultInjector(options=self.options)
    def _block_keys(self, digests: list[bytes], segment_tokens: list[int], prompt_tokens: int) -> list[BlockKey]:
        """The prompt's cache blocks; its last token is always prefilled, as in vLLM."""
        return block_keys(
            digests,
            segment_tokens,
            block_tokens=self.options.prefix_cache_block_tokens,
            max_tokens=prompt_tokens - 1,
        )

    async def _generate(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        generation: Generation,
        plans: list[ChoicePlan],
        render: Callable[[list[ChoicePlan], wire.Envelope], wire.StreamPlan | bytes],
        envelope: wire.Envelope,
    ) -> Outcome:
        """Inject faults, then send the reply ``render`` gives on the engine's schedule until
        done or disconnected. It is rendered once prefill is done, when the cached tokens
        its usage reports are known."""
        try:
            steps = max(plan.completion_tokens for plan in plans)
            fault = self._faults.plan(steps=steps)
            if fault.error:
                self.stats.errors_injected += 1
                raise GatewayError("the simulated engine failed (injected fault)", code="injected_fault")
            if fault.rate_limited:
                self.stats.rate_limited += 1
                raise RateLimited(
                    "simulated rate limit (injected fault)",
                    headers={"Retry-After": str(self.options.retry_after_seconds)},
                )
            def rendered() -> wire.StreamPlan | bytes:
                if self.options.prefix_cache:
                    return render(plans, dataclasses.replace(envelope, cached_tokens=generation.cached_tokens))
                return render(plans, envelope)

            if render is wire.chat_stream or render is wire.completion_stream:
                work = stream_reply(scope, send, generation, rendered, Faults(fault, self.stats, self.options.stall_ms))
            else:
                work = whole_reply(scope, send, generation, rendered, steps, Faults(fault, self.stats, self.options.stall_ms))
            outcome = await until_disconnect(receive, work)
        finally:
            generation.close()
        if generation.first_token_at is not None:
            self.stats.record_generation(generation)
        if outcome is Outcome.COMPLETED:
            usage = wire.usage(plans, generation.prompt_tokens)
            self.stats.prompt_tokens_total += usage["prompt_tokens"]
            self.stats.completion_tokens_total += usage["completion_tokens"]
        return outcome

    # -- helpers -------------------------------------------------------------------

    def _parse(self, scope: Scope, raw: bytes) -> dict[str, Any]:
        body = self.stats.record_request(scope, raw)
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object")
        return body

    def _model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        if model is None:
            return self.options.default_model
        if not isinstance(model, str) or not model:
            raise InvalidRequest("model must be a non-empty string", param="model")
        if self.options.models and model not in self.options.models:
            raise NotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")
        return model

    def _envelope(
        self, prefix: str, body: Mapping[str, Any], *, model: str, prompt_tokens: int
    ) -> wire.Envelope:
        stream_options = body.get("stream_options")
        include_usage = isinstance(stream_options, Mapping) and stream_options.get("include_usage") is True
        return wire.Envelope(
            id=f"{prefix}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=model,
            prompt_tokens=prompt_tokens,
            include_usage=include_usage,
        )

    # -- plain endpoints -----------------------------------------------------------

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        names = self.options.models or (self.options.default_model,)
        data = [
            {"id": m, "object": "model", "created": self._started_at, "owned_by": "latgate-sim"}
            for m in names
        ]
        await send_bytes(send, 200, orjson.dumps({"object": "list", "data": data}), headers=JSON_HEADERS)

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, b"", headers=[])

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        text = prometheus_text(
            self.stats,
            running=self.engine.running,
            waiting=self.engine.waiting,
            cache=self.engine.prefix_cache if self.options.prefix_cache else None,
            model_name=self.options.models[0] if self.options.models else self.options.name,
        )
        await send_bytes(
            send, 200, text, headers=[(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        )


def wants_stream(body: Mapping[str, Any]) -> bool:
    """True when the request asks for an SSE stream (``"stream": true``)."""
    return body.get("stream") is True
