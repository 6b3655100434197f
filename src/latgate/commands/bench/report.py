"""The bench report: a table for people, a JSON document for programs.

JSON schema (``--json OUT``; version ``latgate.commands.bench/1``; times in ms, rates in
tokens/s, ``null`` where a value could not be measured)::

    {
      "schema": "latgate.commands.bench/1",
      "config": {"url", "model", "requests", "concurrency", "stream", "prompt_tokens",
                 "prompt_tokens_estimate", "max_tokens", "shared_prefix",
                 "timeout_seconds", "header_names": [...]},        # header values omitted
      "totals": {"requests", "succeeded", "failed", "duration_seconds",
                 "requests_per_second", "completion_tokens", "output_tokens_per_second"},
      "summary": {                                                    # successful requests only
        "ttft_ms" | "e2e_ms" | "itl_ms" | "tokens_per_second" | "e2e_tokens_per_second":
            {"count", "mean", "min", "p50", "p90", "p99", "max"} or null
      },
      "errors": {"<error_kind>": count, ...},        # e.g. "http_429", "connect_error"
      "providers": {"<X-Latgate-Provider or (none)>":
                        {"requests", "errors", "ttft_ms_p50", "tokens_per_second_p50"}},
      "route_reasons": {"<X-Latgate-Route-Reason or (none)>": count},
      "samples": [                                     # one per request, by "index"
        {"index", "ok", "status_code", "error_kind", "error_message", "provider",
         "route_reason", "ttft_ms", "e2e_ms", "completion_tokens", "prompt_tokens",
         "usage_reported", "output_chunks", "tokens_per_second", "e2e_tokens_per_second",
         "finish_reason", "itl_ms_p50", "itl_ms_max"}
      ]
    }

``tokens_per_second`` is the decode rate a client sees (completion tokens over the time
from first to last output chunk); ``e2e_tokens_per_second`` divides by the whole
request time instead. Per-request inter-token gaps are summarised (p50, max) rather
than listed, to keep the file small; ``summary.itl_ms`` pools all of them.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from latgate.commands.bench.runner import BenchConfig, BenchResult
from latgate.commands.bench.sample import RequestSample
from latgate.commands.bench.stats import BenchSummary, summarize

SCHEMA_VERSION = "latgate.commands.bench/1"

_METRIC_LABELS = {
    "ttft_ms": "TTFT (ms)",
    "e2e_ms": "e2e latency (ms)",
    "itl_ms": "inter-token gap (ms)",
    "tokens_per_second": "decode tokens/s",
    "e2e_tokens_per_second": "e2e tokens/s",
}


def build_report_document(config: BenchConfig, result: BenchResult, summary: BenchSummary) -> dict[str, Any]:
    """The JSON document described in this module's docstring."""
    return {
        "schema": SCHEMA_VERSION,
        "config": {
            "url": config.chat_completions_url,
            "model": config.model,
            "requests": config.requests,
            "concurrency": config.concurrency,
            "stream": config.stream,
            "prompt_tokens": config.prompt_tokens,
            "prompt_tokens_estimate": result.prompt_tokens_estimate,
            "max_tokens": config.max_tokens,
            "shared_prefix": config.shared_prefix,
            "timeout_seconds": config.timeout_seconds,
            "header_names": [name for name, _ in config.headers],
        },
        "totals": {
            "requests": summary.requests,
            "succeeded": summary.succeeded,
            "failed": summary.failed,
            "duration_seconds": summary.duration_seconds,
            "requests_per_second": summary.requests_per_second,
            "completion_tokens": summary.completion_tokens,
            "output_tokens_per_second": summary.output_tokens_per_second,
        },
        "summary": {name: asdict(m) if m else None for name, m in summary.metrics.items()},
        "errors": summary.errors,
        "providers": {name: asdict(p) for name, p in summary.providers.items()},
        "route_reasons": summary.route_reasons,
        "samples": [_sample_document(sample) for sample in result.samples],
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` as indented UTF-8 JSON. Raises OSError."""
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")


def render_report(console: Console, config: BenchConfig, result: BenchResult, summary: BenchSummary) -> None:
    """Print the metrics table, then one line each for totals, errors and providers.

    A single-request run (the "stream one chat completion" check of a new gateway) also gets a
    line with that request's TTFT, total latency, token count, tokens/s and provider.
    """
    mode = "streamed" if config.stream else "not streamed"
    console.print(
        f"latgate bench: model {config.model} at {config.chat_completions_url}, {mode}, "
        f"{config.requests} requests, concurrency {config.concurrency}",
        soft_wrap=True,
    )
    table = Table()
    table.add_column("metric")
    for column in ("p50", "p90", "p99", "mean", "max", "n"):
        table.add_column(column, justify="right")
    for name, label in _METRIC_LABELS.items():
        metric = summary.metrics[name]
        if metric is None:
            table.add_row(label, "-", "-", "-", "-", "-", "0")
        else:
            values = (metric.p50, metric.p90, metric.p99, metric.mean, metric.max)
            table.add_row(label, *(_number(v) for v in values), str(metric.count))
    console.print(table)
    console.print(
        f"requests: {summary.requests} ({summary.succeeded} ok, {summary.failed} failed) in "
        f"{summary.duration_seconds:.2f} s, {summary.requests_per_second:.2f} req/s; "
        f"{summary.completion_tokens} completion tokens, "
        f"{summary.output_tokens_per_second:.1f} tokens/s aggregate",
        soft_wrap=True,
    )
    if summary.errors:
        errors = ", ".join(f"{kind} x{count}" for kind, count in summary.errors.items())
        console.print(f"errors: {errors}", soft_wrap=True)
    providers = ", ".join(
        f"{name} x{provider.requests} (TTFT p50 {_number(provider.ttft_ms_p50)} ms, "
        f"{_number(provider.tokens_per_second_p50)} tok/s)"
        for name, provider in summary.providers.items()
    )
    console.print(f"providers: {providers or '-'}", soft_wrap=True)
    if summary.route_reasons and set(summary.route_reasons) != {"(none)"}:
        reasons = ", ".join(f"{reason} x{count}" for reason, count in summary.route_reasons.items())
        console.print(f"route reasons: {reasons}", soft_wrap=True)
    if len(result.samples) == 1 and result.samples[0].ok:
        console.print(_single_request_line(result.samples[0]), soft_wrap=True)


def first_error_line(result: BenchResult) -> str:
    """A one-line description of the first failure, for the exit message."""
    failed = next((s for s in result.samples if not s.ok), None)
    if failed is None:
        return "no errors"
    return f"{failed.error_kind}: {failed.error_message}"


def _single_request_line(sample: RequestSample) -> str:
    return (
        f"TTFT {_number(sample.ttft_ms)} ms, total {_number(sample.e2e_ms)} ms, "
        f"{sample.completion_tokens} completion tokens, {_number(sample.tokens_per_second)} tokens/s decode "
        f"({_number(sample.e2e_tokens_per_second)} e2e), provider {sample.provider or '(none)'}"
    )


def _sample_document(sample: RequestSample) -> dict[str, Any]:
    document = asdict(sample)
    gaps = document.pop("itl_ms")
    itl = summarize(gaps)
    document["itl_ms_p50"] = itl.p50 if itl else None
    document["itl_ms_max"] = itl.max if itl else None
    return document


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
