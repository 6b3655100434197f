"""One endpoint's prompt tokens served from its engine's prefix cache: latgate's
prediction against the engine's report (:mod:`latgate.live.providers.cache_evidence`)."""

from __future__ import annotations

from dataclasses import dataclass

from latgate.live.providers.engine_cache import EngineCacheFacts


@dataclass(slots=True)
class CacheHits:
    """One endpoint's prompt tokens served from its engine's prefix cache, as latgate
    predicted them and as the engine reported them (``/admin/providers``, ``/ui``).

    Attributes:
        predicted_tokens / prompt_tokens: the index's match and the estimated prompt of
            each request it prefilled (summed).
        reported_tokens / reported_prompt_tokens: the engine's reported cached tokens
            and its ``usage.prompt_tokens`` of the answers that reported, or the
            increase of its hit counters where answers report nothing (summed).
        reports: answers that reported cached tokens.
        misses / confirmations: reports below the match (the engine had evicted) and at
            or above it (see :func:`reported_evidence`).
        counters_prompt_tokens / counters_predicted_tokens: ``prompt_tokens`` and
            ``predicted_tokens`` at the last read of the engine's hit counters, and
            ``counters_queried`` / ``counters_hit`` the counters then (None before one).
    """

    predicted_tokens: int = 0
    prompt_tokens: int = 0
    reported_tokens: int = 0
    reported_prompt_tokens: int = 0
    reports: int = 0
    misses: int = 0
    confirmations: int = 0
    counters_prompt_tokens: int = 0
    counters_predicted_tokens: int = 0
    counters_queried: float | None = None
    counters_hit: float | None = None

    def counters_interval(self, cache: EngineCacheFacts) -> tuple[float, float, int, int] | None:
        """The engine's hit counters read anew (``cache``): ``(queried, hit, prompt,
        predicted)`` since the last read, the engine's increases and latgate's prompt
        and predicted cached tokens meanwhile, with the increases counted as reported
        when ``reported``. None on the first read, after the engine restarted (its
        counters went back), without counters, with no query meanwhile, or where
        answers report cached tokens themselves (their report is the better one)."""
        queried, hit = cache.queried_tokens, cache.hit_tokens
        if queried is None or hit is None or self.reports:
            return None
        before_queried, before_hit = self.counters_queried, self.counters_hit
        prompt = self.prompt_tokens - self.counters_prompt_tokens
        predicted = self.predicted_tokens - self.counters_predicted_tokens
        self.counters_queried, self.counters_hit = queried, hit
        self.counters_prompt_tokens, self.counters_predicted_tokens = self.prompt_tokens, self.predicted_tokens
        if before_queried is None or before_hit is None or queried <= before_queried or hit < before_hit:
            return None
        queried_delta, hit_delta = queried - before_queried, hit - before_hit
        self.reported_tokens += int(hit_delta)
        self.reported_prompt_tokens += int(queried_delta)
        return queried_delta, hit_delta, prompt, predicted

    def describe(self) -> dict[str, object]:
        """The counts, with each side's hit ratio (None before a prompt)."""
        return {
            "predicted_tokens": self.predicted_tokens,
            "prompt_tokens": self.prompt_tokens,
            "predicted_ratio": round(self.predicted_tokens / self.prompt_tokens, 4) if self.prompt_tokens else None,
            "reported_tokens": self.reported_tokens,
            "reported_prompt_tokens": self.reported_prompt_tokens,
            "reported_ratio": round(self.reported_tokens / self.reported_prompt_tokens, 4)
            if self.reported_prompt_tokens
            else None,
            "reports": self.reports,
            "misses": self.misses,
            "confirmations": self.confirmations,
        }
