"""One attempt on one endpoint, as the pool tracks it from sending it until it is done with."""

from __future__ import annotations

from dataclasses import dataclass

from latgate.routing.prefix_index import PromptPrefix


@dataclass(slots=True, eq=False)
class Ticket:
    """One attempt on one endpoint, from sending it until it is done with.

    Attributes:
        prompt_tokens: the request's prompt size (routing's estimate).
        queue_ms: the queue wait predicted when it was sent (taken out of its TTFT).
        started_at: ``time.perf_counter()`` when it was sent.
        first_token_ms: its TTFT once seen.
        censored: it ended (cancelled, or past its first-token deadline) before a first
            token: its elapsed time is a lower bound of the endpoint's TTFT.
        trial: it is a half-open circuit's trial.
        succeeded: the endpoint answered it (set by :meth:`ProviderPool.record_outcome`).
        budget_deadline: its first-token deadline came from the request's budget: missing
            it is a latency verdict (the censored TTFT), not an error of the endpoint.
        sent_at: the pool clock's reading when it was sent (its entry in the
            endpoint's ``leases``).
        prefix: the prompt's samples (:mod:`latgate.routing.prefix_index`), recorded in
            the endpoint's prefix index at its first token; None without one.
        cached_tokens: prompt tokens the endpoint was believed to hold when it was sent
            (``prompt_tokens`` is the rest: what the TTFT fit is on).
        prefilling: its ``prompt_tokens`` still count in the endpoint's ``prefill_tokens``.
        estimated_prompt_tokens: the whole prompt (routing's estimate), cached or not.
        deferred_ttft_ms: its TTFT, seen, whose observation waits for the answer's
            reported cached tokens (:meth:`ProviderPool.record_cached_tokens`).
        completion_tokens: the completion tokens the request is expected to produce
            (its plan's; 0: unknown), what its slot's lease is priced at.
    """

    prompt_tokens: int
    queue_ms: float
    started_at: float
    sent_at: float = 0.0
    first_token_ms: float | None = None
    censored: bool = False
    trial: bool = False
    succeeded: bool = False
    budget_deadline: bool = False
    prefix: PromptPrefix | None = None
    cached_tokens: int = 0
    prefilling: bool = False
    estimated_prompt_tokens: int = 0
    deferred_ttft_ms: float | None = None
    completion_tokens: int = 0
