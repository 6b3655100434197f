"""The engine's own word on its prefix cache, against what latgate's prefix index believed.

Two reports, both in the engine's tokens:

- per answer, ``usage.prompt_tokens_details.cached_tokens`` (vLLM with
  ``--enable-prompt-tokens-details``, SGLang, OpenAI-style hosted APIs; read by
  :func:`latgate.forwarding.usage.cached_prompt_tokens`) beside ``usage.prompt_tokens``;
- per interval, vLLM's ``prefix_cache_hits`` / ``prefix_cache_queries`` counters on
  ``/metrics`` (:mod:`latgate.live.providers.engine_cache`), used where the answers report
  nothing.

latgate's own numbers are its estimate of the prompt's tokens and the index's match
(:mod:`latgate.routing.prefix_index`), in estimated tokens. The two are compared as
fractions of the prompt, so the estimate's error against the engine's tokenizer cancels.

- **The fit.** The TTFT line is fitted on the prompt tokens the engine really prefilled:
  the estimate times the reported uncached fraction (:func:`reported_evidence`).
- **The index.** A report below the match by more than ``SLACK_FRACTION`` and a block
  means the engine evicted what the index still holds: other traffic on the engine, or
  another latgate replica, fills its cache, so the index's effective capacity is too
  large by at least the missed tokens (``shortfall_tokens``, positive). A report above
  the match means the engine held more than believed (negative: capacity given back).
  The prompt's own samples stay recorded: the engine has just prefilled them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from latgate.routing.prefix_index import MIN_ENTRY_TOKENS

if TYPE_CHECKING:
    from latgate.live.providers.endpoint import EndpointRuntime
    from latgate.live.providers.ticket import Ticket

SLACK_FRACTION = 0.05
"""Of the prompt: how far a report may fall short of the match before it is a miss (the
spread of prompt tokens over characters is an approximation)."""


@dataclass(frozen=True, slots=True)
class CacheEvidence:
    """What one report says (see the module docstring).

    Attributes:
        uncached_tokens: the prompt's tokens the engine prefilled, in latgate's estimate.
        shortfall_tokens: estimated tokens the index believed held and the engine did
            not (positive), or held beyond the index's belief (negative); 0 within slack.
    """

    uncached_tokens: int
    shortfall_tokens: int


def reported_evidence(
    *,
    prompt_tokens: int,
    predicted_cached_tokens: int,
    reported_prompt_tokens: int,
    reported_cached_tokens: int,
    block_tokens: int = 16,
) -> CacheEvidence:
    """Compare one answer's report with the index's prediction.

    Args:
        prompt_tokens: latgate's estimate of the prompt's tokens (routing's).
        predicted_cached_tokens: the index's match on the endpoint when it was sent
            (estimated tokens, at most ``prompt_tokens``).
        reported_prompt_tokens: ``usage.prompt_tokens`` (the engine's tokens; 0 or less
            is taken as the estimate).
        reported_cached_tokens: ``usage.prompt_tokens_details.cached_tokens``.
        block_tokens: the engine's cache block (vLLM reports hits in whole blocks).

    Example::

        reported_evidence(prompt_tokens=10_000, predicted_cached_tokens=9_000,
                          reported_prompt_tokens=12_000, reported_cached_tokens=2_400)
        # CacheEvidence(uncached_tokens=8000, shortfall_tokens=7000)
    """
    if prompt_tokens <= 0:
        return CacheEvidence(0, 0)
    engine_prompt = reported_prompt_tokens if reported_prompt_tokens > 0 else prompt_tokens
    reported = min(1.0, max(0, reported_cached_tokens) / engine_prompt)
    predicted = min(1.0, max(0, predicted_cached_tokens) / prompt_tokens)
    uncached = round(prompt_tokens * (1.0 - reported))
    return CacheEvidence(uncached, _shortfall(prompt_tokens, predicted, reported, block_tokens / engine_prompt))


def take_report(endpoint: EndpointRuntime, ticket: Ticket | None, *, cached_tokens: int, prompt_tokens: int) -> None:
    """One answer's report of ``cached_tokens`` of its ``prompt_tokens`` (the engine's
    count) on ``endpoint``: counted in its :class:`CacheHits`; for an attempt with a
    prompt prefix, the index's effective capacity corrected (:meth:`PrefixIndex.correct
    <latgate.routing.prefix_index.PrefixIndex.correct>`) and the ticket's
    ``prompt_tokens`` (what its TTFT is fitted on) set to the tokens really prefilled."""
    hits = endpoint.cache_hits
    hits.reported_tokens += cached_tokens
    hits.reported_prompt_tokens += prompt_tokens
    hits.reports += 1
    index = endpoint.prefix_index
    if ticket is None or ticket.prefix is None or index is None:
        return
    block = endpoint.engine_cache.block_size_tokens if endpoint.engine_cache is not None else None
    evidence = reported_evidence(
        prompt_tokens=ticket.estimated_prompt_tokens,
        predicted_cached_tokens=ticket.cached_tokens,
        reported_prompt_tokens=prompt_tokens,
        reported_cached_tokens=cached_tokens,
        block_tokens=block or MIN_ENTRY_TOKENS,
    )
    if evidence.shortfall_tokens > 0:
        hits.misses += 1
    else:
        hits.confirmations += 1
    index.correct(evidence.shortfall_tokens)
    if ticket.prefilling:  # a non-streamed answer, not yet taken as prefilled
        endpoint.prefill_tokens += evidence.uncached_tokens - ticket.prompt_tokens
    ticket.prompt_tokens = evidence.uncached_tokens


def counters_evidence(
    *,
    prompt_tokens: int,
    predicted_cached_tokens: int,
    queried_tokens: float,
    hit_tokens: float,
) -> int:
    """The shortfall (see :class:`CacheEvidence`) shown by an engine's hit counters over an
    interval: ``queried_tokens`` / ``hit_tokens`` their increase (vLLM's
    ``prefix_cache_queries`` / ``prefix_cache_hits``), against latgate's requests prefilled
    there meanwhile (``prompt_tokens`` estimated, of which ``predicted_cached_tokens`` the
    index matched). 0 when either side saw no prompt.

    Example::

        counters_evidence(prompt_tokens=20_000, predicted_cached_tokens=18_000,
                          queried_tokens=20_000, hit_tokens=10_000)  # 8000
    """
    if prompt_tokens <= 0 or queried_tokens <= 0:
        return 0
    reported = min(1.0, max(0.0, hit_tokens) / queried_tokens)
    predicted = min(1.0, max(0, predicted_cached_tokens) / prompt_tokens)
    return _shortfall(prompt_tokens, predicted, reported, 0.0)


def _shortfall(prompt_tokens: int, predicted: float, reported: float, block: float) -> int:
    slack = SLACK_FRACTION + block
    if abs(predicted - reported) <= slack:
        return 0
    return round((predicted - reported) * prompt_tokens)
