"""What a simulator has seen: counters for tests, and its Prometheus ``/metrics`` text.

The counters live on ``app.state.sim`` (a :class:`SimStats`), written only by the
server's event loop; tests read them from their own thread. A test that needs to know
the simulator noticed a client going away waits on :attr:`SimStats.disconnected_event`
(a ``threading.Event``, since the server usually runs in another thread).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from latgate.commands.sim.asgi import Outcome

if TYPE_CHECKING:
    from latgate.commands.sim.engine import Generation
    from latgate.commands.sim.prefix_cache import BlockCache

RECENT_REQUESTS = 256


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as it arrived: ``headers`` lower-cased, ``body`` the parsed JSON or ``None``."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class GenerationRecord:
    """How one request went through the engine, once its first token was due.

    Attributes:
        prompt_tokens / cached_tokens: its prompt, and the part served from the cache.
        queue_wait_seconds: waiting for a batch slot.
        prefill_wait_seconds: holding a slot, waiting for other prefills
            (``prefill_concurrency``).
        prefill_seconds: its own prefill (fixed overhead plus uncached tokens).
        ttft_seconds: the three together: from arrival at the engine to the first token.
    """

    prompt_tokens: int
    cached_tokens: int
    queue_wait_seconds: float
    prefill_wait_seconds: float
    prefill_seconds: float
    ttft_seconds: float


@dataclass
class SimStats:
    """Counters since start (generation endpoints: chat and legacy completions, embeddings).

    Attributes:
        requests_total: generation requests received, valid or not.
        in_flight: generation requests not yet answered (queued, prefilling, streaming).
        completed: replies sent in full.
        disconnects: replies abandoned because the client went away; each one also sets
            ``disconnected_event`` (after the request left the engine and ``in_flight``).
        errors_injected / rate_limited / stalls / drops: faults injected.
        busy_rejections / decode_errors: profile ``tilert``: 429s for want of a free
            decode node, and ``[decode error: ...]`` written into answers.
        prompt_tokens_total / completion_tokens_total: usage of completed replies.
        received: the last 256 requests (:class:`ReceivedRequest`), newest last.
        generations: the last 256 requests' engine timelines (:class:`GenerationRecord`),
            in the order they ended, newest last.
    """

    requests_total: int = 0
    in_flight: int = 0
    completed: int = 0
    disconnects: int = 0
    errors_injected: int = 0
    rate_limited: int = 0
    stalls: int = 0
    drops: int = 0
    busy_rejections: int = 0
    decode_errors: int = 0
    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0
    received: deque[ReceivedRequest] = field(
        default_factory=lambda: deque(maxlen=RECENT_REQUESTS), repr=False
    )
    generations: deque[GenerationRecord] = field(
        default_factory=lambda: deque(maxlen=RECENT_REQUESTS), repr=False
    )
    disconnected_event: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def last_request(self) -> ReceivedRequest | None:
        """The newest received request, if any."""
        return self.received[-1] if self.received else None

    def record_request(self, scope: Mapping[str, Any], raw: bytes) -> Any:
        """Parse ``raw`` as JSON and append the request to :attr:`received`.

        Args:
            scope: the ASGI HTTP scope (``method``, ``path``, ``headers``).
            raw: the whole request body.

        Returns:
            The parsed body, or ``None`` when it is not JSON (any JSON value otherwise:
            the caller decides what an object-less body is worth).
        """
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.received.append(ReceivedRequest(scope["method"], scope["path"], headers, body))
        return body

    def request_started(self) -> None:
        """Count a generation request arriving (``requests_total``, ``in_flight``)."""
        self.requests_total += 1
        self.in_flight += 1

    def request_ended(self, outcome: Outcome | None) -> None:
        """Count a generation request leaving: ``completed`` when ``outcome`` is
        :attr:`Outcome.COMPLETED`, out of ``in_flight``, then a disconnect when it is
        :attr:`Outcome.DISCONNECTED` (``None``: refused or failed, counted elsewhere)."""
        if outcome is Outcome.COMPLETED:
            self.completed += 1
        self.in_flight -= 1
        if outcome is Outcome.DISCONNECTED:
            self.record_disconnect()

    def record_generation(self, generation: Generation) -> None:
        """Append a generation whose first token was due to :attr:`generations`."""
        assert generation.admitted_at is not None and generation.prefill_started_at is not None
        assert generation.first_token_at is not None
        self.generations.append(
            GenerationRecord(
                prompt_tokens=generation.prompt_tokens,
                cached_tokens=generation.cached_tokens,
                queue_wait_seconds=generation.admitted_at - generation.queued_at,
                prefill_wait_seconds=generation.prefill_started_at - generation.admitted_at,
                prefill_seconds=generation.first_token_at - generation.prefill_started_at,
                ttft_seconds=generation.first_token_at - generation.queued_at,
            )
        )

    def record_disconnect(self) -> None:
        self.disconnects += 1
        self.disconnected_event.set()


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(
    stats: SimStats, *, running: int, waiting: int, model_name: str, cache: BlockCache | None = None
) -> bytes:
    """Prometheus text exposition (format 0.0.4) of the engine gauges and counters.

    Gauges carry the names vLLM exports (``vllm:num_requests_running``,
    ``vllm:num_requests_waiting``, label ``model_name``) and SGLang's
    (``sglang:num_running_reqs``, ``sglang:num_queue_reqs``), so either connector can
    read the simulator's load. With a prefix ``cache``, also vLLM's (0.32) prefix-cache
    series: counters ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``
    (prompt tokens looked up / found), gauge ``vllm:kv_cache_usage_perc`` (0..1) and the
    info gauge ``vllm:cache_config_info`` (labels ``block_size``, ``num_gpu_blocks``,
    ``kv_cache_size_tokens``, ``enable_prefix_caching``; value 1).
    """
    label = f'{{model_name="{_label(model_name)}"}}'
    rows: list[tuple[str, str, str, list[tuple[str, float]]]] = [
        ("vllm:num_requests_running", "gauge", "Requests in the running batch.", [(label, running)]),
        ("vllm:num_requests_waiting", "gauge", "Requests waiting for a batch slot.", [(label, waiting)]),
        ("sglang:num_running_reqs", "gauge", "Requests in the running batch.", [(label, running)]),
        ("sglang:num_queue_reqs", "gauge", "Requests waiting for a batch slot.", [(label, waiting)]),
        ("vllm:prompt_tokens_total", "counter", "Prompt tokens of completed requests.",
         [(label, stats.prompt_tokens_total)]),
        ("vllm:generation_tokens_total", "counter", "Generated tokens of completed requests.",
         [(label, stats.completion_tokens_total)]),
        ("vllm:request_success_total", "counter", "Requests completed.", [(label, stats.completed)]),
        ("latgate_sim_requests_total", "counter", "Generation requests received.", [("", stats.requests_total)]),
        ("latgate_sim_disconnects_total", "counter", "Replies abandoned by the client.",
         [("", stats.disconnects)]),
        ("latgate_sim_faults_total", "counter", "Faults injected, by kind.", [
            ('{kind="error"}', stats.errors_injected),
            ('{kind="rate_limit"}', stats.rate_limited),
            ('{kind="stall"}', stats.stalls),
            ('{kind="drop"}', stats.drops),
        ]),
    ]  # fmt: skip
    if cache is not None:
        config = (
            f'{{block_size="{cache.block_tokens}",enable_prefix_caching="True",'
            f'kv_cache_size_tokens="{cache.capacity_blocks * cache.block_tokens}",'
            f'num_gpu_blocks="{cache.capacity_blocks}"}}'
        )
        rows += [
            ("vllm:prefix_cache_queries_total", "counter",
             "Prefix cache queries, in terms of number of queried tokens.", [(label, cache.queried_tokens)]),
            ("vllm:prefix_cache_hits_total", "counter",
             "Prefix cache hits, in terms of number of cached tokens.", [(label, cache.hit_tokens)]),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
             [(label, cache.usage)]),
            ("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", [(config, 1)]),
        ]  # fmt: skip
    lines = []
    for name, kind, help_text, samples in rows:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {float(value)}" for labels, value in samples)
    return ("\n".join(lines) + "\n").encode()
