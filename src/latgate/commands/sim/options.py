"""The simulator's knobs: one frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL_NAME = "sim-model"
PROFILES = ("openai", "tilert")
"""``openai``: an OpenAI-compatible engine (vLLM's server). ``tilert``: TileRT's
prefill/decode router (:mod:`latgate.commands.sim.tilert`)."""


@dataclass(frozen=True, kw_only=True)
class SimOptions:
    """How one simulated engine behaves (timing model, limits, faults).

    Timing (see :mod:`latgate.commands.sim.engine`): a request waits in a FIFO queue until one
    of ``max_batch_size`` slots is free, then (with ``prefill_concurrency``) in a second
    FIFO queue until fewer than that many requests are prefilling; its first token
    comes ``ttft_overhead_ms + uncached_prompt_tokens / prefill_tokens_per_second``
    after its prefill starts; then one token every ``tpot_ms + tpot_growth_ms *
    (running - 1)`` milliseconds, ``running`` being the requests holding a slot at that
    moment.

    Attributes:
        name: shown in logs and as the ``model_name`` label of ``/metrics``.
        models: served model names; empty accepts any name. Others get 404
            ``model_not_found``.
        prefill_tokens_per_second: prompt tokens processed per second (> 0).
        ttft_overhead_ms: fixed time added to every first token (>= 0).
        tpot_ms: time per output token with one running request (>= 0).
        tpot_growth_ms: added to the time per output token for each further running
            request (>= 0).
        max_batch_size: requests running at once (>= 1); the rest wait.
        prefill_concurrency: requests prefilling at once (>= 0; 0: no limit, every
            admitted request prefills at once). 1 models a compute-bound engine: a
            prompt's prefill waits for every prefill ahead of it.
        prefix_cache: a block-level prefix cache (:mod:`latgate.commands.sim.prefix_cache`):
            the leading full blocks of a prompt held from an earlier one cost no
            prefill, and usage reports them as ``prompt_tokens_details.cached_tokens``.
        prefix_cache_tokens: the cache's capacity in tokens (>= 0), evicted LRU.
        prefix_cache_block_tokens: tokens per cache block (>= 1; vLLM's ``block_size``).
        default_max_tokens: completion tokens when the request sets no ``max_tokens``
            / ``max_completion_tokens``.
        max_output_tokens: cap on completion tokens per choice, whatever the request
            asks (keeps agent turns with ``max_tokens: 32000`` short).
        preferred_tools: tool names to call, in order of preference, when the request
            offers one of them (else the first tool): lets a test steer a real agent to
            a harmless tool (its shell) rather than, say, one that spawns sub-agents.
        error_rate / rate_limit_rate / stall_rate / drop_rate: per-request
            probabilities in [0, 1] of a 500, of a 429 (with ``Retry-After:
            retry_after_seconds``), of a ``stall_ms`` pause mid-reply, of the connection
            closing mid-reply (a stream then never sends ``[DONE]``).
        profile: the wire interface served, one of :data:`PROFILES`.
        decode_nodes: profile ``tilert``: decode nodes, one request each (>= 1); a
            request finding none free is answered 429 at once.
        decode_error_rate / decode_error_after_tokens: profile ``tilert``: probability
            per streamed request that decoding fails after that many content tokens,
            written into the answer as TileRT does (``"\\n[decode error: ...]"``).
        seed: makes faults reproducible for a given request sequence (``None``: a
            fresh random sequence). Reply text and timing are always a function of the
            request and the seed (``None`` counts as 0 there).

    Raises:
        ValueError: a value out of range (the message names the field).
    """

    name: str = "sim"
    models: tuple[str, ...] = ()
    prefill_tokens_per_second: float = 20_000.0
    ttft_overhead_ms: float = 5.0
    tpot_ms: float = 2.0
    tpot_growth_ms: float = 0.1
    max_batch_size: int = 64
    prefill_concurrency: int = 0
    prefix_cache: bool = False
    prefix_cache_tokens: int = 1_048_576
    prefix_cache_block_tokens: int = 16
    default_max_tokens: int = 64
    max_output_tokens: int = 512
    preferred_tools: tuple[str, ...] = ()
    error_rate: float = 0.0
    rate_limit_rate: float = 0.0
    retry_after_seconds: int = 1
    stall_rate: float = 0.0
    stall_ms: float = 1000.0
    drop_rate: float = 0.0
    profile: str = "openai"
    decode_nodes: int = 8
    decode_error_rate: float = 0.0
    decode_error_after_tokens: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "preferred_tools", tuple(self.preferred_tools))
        if self.prefill_tokens_per_second <= 0:
            raise ValueError(f"prefill_tokens_per_second must be > 0, got {self.prefill_tokens_per_second}")
        for field in ("ttft_overhead_ms", "tpot_ms", "tpot_growth_ms", "stall_ms"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must be >= 0, got {getattr(self, field)}")
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {self.profile!r}")
        if self.decode_error_after_tokens < 0:
            raise ValueError(f"decode_error_after_tokens must be >= 0, got {self.decode_error_after_tokens}")
        for field in ("prefill_concurrency", "prefix_cache_tokens"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must be >= 0, got {getattr(self, field)}")
        fields = ("max_batch_size", "default_max_tokens", "max_output_tokens", "decode_nodes", "prefix_cache_block_tokens")
        for field in fields:
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be >= 1, got {getattr(self, field)}")
        if self.retry_after_seconds < 0:
            raise ValueError(f"retry_after_seconds must be >= 0, got {self.retry_after_seconds}")
        for field in ("error_rate", "rate_limit_rate", "stall_rate", "drop_rate", "decode_error_rate"):
            if not 0.0 <= getattr(self, field) <= 1.0:
                raise ValueError(f"{field} must be between 0 and 1, got {getattr(self, field)}")

    @property
    def default_model(self) -> str:
        """The model name used when a request names none (and listed when ``models`` is empty)."""
        return self.models[0] if self.models else DEFAULT_MODEL_NAME
