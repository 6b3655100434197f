"""The load/latency measurement client behind ``latgate bench``.

``run_bench(BenchConfig(...))`` sends the requests and returns per-request samples;
``summarize_samples`` turns them into p50/p90/p99 per metric, errors and providers;
``latgate.commands.bench.report`` renders the table and the JSON document (its schema is in
that module's docstring); ``latgate.commands.bench.plot`` draws the PNG.
"""

from latgate.commands.bench.runner import BenchConfig, BenchResult, normalize_base_url, run_bench
from latgate.commands.bench.sample import RequestSample, SampleRecorder
from latgate.commands.bench.stats import BenchSummary, MetricSummary, summarize_samples

__all__ = [
    "BenchConfig",
    "BenchResult",
    "BenchSummary",
    "MetricSummary",
    "RequestSample",
    "SampleRecorder",
    "normalize_base_url",
    "run_bench",
    "summarize_samples",
]
