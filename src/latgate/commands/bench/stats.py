"""Summary statistics of a bench run: percentiles per metric, errors, providers.

Percentiles use linear interpolation between closest ranks (the "linear" method of
Hyndman & Fan type 7, numpy's default): for sorted values ``v`` of length ``n``, the
p-th percentile is at rank ``p/100 * (n - 1)``. Only successful requests feed the
latency and rate metrics; failed ones are counted by ``error_kind``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from latgate.commands.bench.sample import RequestSample

METRIC_NAMES = ("ttft_ms", "e2e_ms", "itl_ms", "tokens_per_second", "e2e_tokens_per_second")
NO_PROVIDER = "(none)"


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricSummary:
    """Distribution of one metric, in that metric's unit."""

    count: int
    mean: float
    min: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderSummary:
    """The requests one provider (``X-Latgate-Provider``) answered."""

    requests: int
    errors: int
    ttft_ms_p50: float | None
    tokens_per_second_p50: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchSummary:
    """Everything the report shows about a run.

    ``metrics`` maps each of ``METRIC_NAMES`` to its summary, or ``None`` when no
    successful request produced a value (``itl_ms`` pools every gap of every request).
    ``errors`` counts failed requests by ``error_kind``. ``providers`` and
    ``route_reasons`` count requests that got an HTTP response, keyed by latgate's
    response headers (``"(none)"`` when the header was absent, as from an engine
    reached directly). ``output_tokens_per_second`` is the run's aggregate throughput:
    all completion tokens / wall-clock duration.
    """

    requests: int
    succeeded: int
    failed: int
    duration_seconds: float
    requests_per_second: float
    completion_tokens: int
    output_tokens_per_second: float
    metrics: dict[str, MetricSummary | None]
    errors: dict[str, int]
    providers: dict[str, ProviderSummary]
    route_reasons: dict[str, int]


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of non-empty ascending ``sorted_values``.

    Raises ValueError on an empty sequence or ``p`` outside 0..100.
    """
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    rank = p / 100 * (len(sorted_values) - 1)
    lower = int(rank)
    upper = min(lower + 1, len(sorted_values) - 1)
    fraction = rank - lower
    return sorted_values[lower] + (sorted_values[upper] - sorted_values[lower]) * fraction


def summarize(values: Sequence[float]) -> MetricSummary | None:
    """Count, mean, min, p50/p90/p99 and max of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return MetricSummary(
        count=len(ordered),
        mean=sum(ordered) / len(ordered),
        min=ordered[0],
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        max=ordered[-1],
    )


def summarize_samples(samples: Sequence[RequestSample], *, duration_seconds: float) -> BenchSummary:
    """Aggregate a run's samples; ``duration_seconds`` is its wall-clock time."""
    succeeded = [s for s in samples if s.ok]
    metric_values: dict[str, list[float]] = {
        "ttft_ms": [s.ttft_ms for s in succeeded if s.ttft_ms is not None],
        "e2e_ms": [s.e2e_ms for s in succeeded],
        "itl_ms": [gap for s in succeeded for gap in s.itl_ms],
        "tokens_per_second": [s.tokens_per_second for s in succeeded if s.tokens_per_second is not None],
        "e2e_tokens_per_second": [
            s.e2e_tokens_per_second for s in succeeded if s.e2e_tokens_per_second is not None
        ],
    }
    completion_tokens = sum(s.completion_tokens or 0 for s in succeeded)
    answered = [s for s in samples if s.status_code is not None]
    return BenchSummary(
        requests=len(samples),
        succeeded=len(succeeded),
        failed=len(samples) - len(succeeded),
        duration_seconds=duration_seconds,
        requests_per_second=len(samples) / duration_seconds if duration_seconds > 0 else 0.0,
        completion_tokens=completion_tokens,
        output_tokens_per_second=completion_tokens / duration_seconds if duration_seconds > 0 else 0.0,
        metrics={name: summarize(metric_values[name]) for name in METRIC_NAMES},
        errors=dict(Counter(s.error_kind for s in samples if s.error_kind is not None).most_common()),
        providers=_summarize_providers(answered),
        route_reasons=dict(Counter(s.route_reason or NO_PROVIDER for s in answered).most_common()),
    )


def _summarize_providers(answered: Sequence[RequestSample]) -> dict[str, ProviderSummary]:
    by_provider: dict[str, list[RequestSample]] = {}
    for sample in answered:
        by_provider.setdefault(sample.provider or NO_PROVIDER, []).append(sample)
    summaries = {}
    for name, group in sorted(by_provider.items(), key=lambda item: -len(item[1])):
        ttft = summarize([s.ttft_ms for s in group if s.ok and s.ttft_ms is not None])
        rate = summarize([s.tokens_per_second for s in group if s.ok and s.tokens_per_second is not None])
        summaries[name] = ProviderSummary(
            requests=len(group),
            errors=sum(1 for s in group if not s.ok),
            ttft_ms_p50=ttft.p50 if ttft else None,
            tokens_per_second_p50=rate.p50 if rate else None,
        )
    return summaries
