"""``latgate bench``: measure TTFT, e2e latency and tokens/s against a base URL.

Sends N streamed chat completions (C at a time) to ``{base-url}/chat/completions``
and reports p50/p90/p99 of time to first token, e2e latency, inter-token gaps and
tokens/s, errors by kind, and which provider answered (latgate's
``X-Latgate-Provider`` header). The base URL may be given with or without ``/v1``:
``/v1`` is appended when the URL's path does not end with it, so
``http://127.0.0.1:8000`` and ``http://127.0.0.1:8000/v1`` are the same (a full
``.../v1/chat/completions`` URL is accepted too).

Exit status: 0 when at least one request succeeded, 1 when every request failed (for
example connection refused), 2 for bad arguments.

Example (the first check of a new gateway: one streamed request through it)::

    latgate bench --base-url http://127.0.0.1:8000 --model glm-5.1-highspeed \\
        -n 1 --max-tokens 300 -H 'X-Latency-Sensitive: 1'
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import sys
from pathlib import Path

from rich.console import Console

from latgate.commands.bench.plot import PlotUnavailableError, ensure_plotting_available, write_plot
from latgate.commands.bench.progress import BenchProgress
from latgate.commands.bench.report import build_report_document, first_error_line, render_report, write_json
from latgate.commands.bench.runner import BenchConfig, BenchResult, normalize_base_url, run_bench
from latgate.commands.bench.stats import summarize_samples

_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 token


class BenchUsageError(ValueError):
    """A bad argument: reported as one line, exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``latgate bench`` options on ``parser``."""
    parser.epilog = (
        "/v1 is appended to --base-url unless its path already ends with it. TTFT runs from sending to the "
        "first chunk with generated content; decode tokens/s = completion tokens / (last - first output "
        "chunk time); e2e tokens/s divides by the whole request time. Exit 1 when every request failed."
    )
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL, with or without /v1")
    parser.add_argument("--model", required=True, help="the model field to send")
    parser.add_argument("-n", "--requests", type=int, default=10, help="number of requests (default 10)")
    parser.add_argument("-c", "--concurrency", type=int, default=1, help="requests in flight (default 1)")
    parser.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stream the responses (default); --no-stream measures e2e only (TTFT = e2e)",
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=128, help="approximate prompt size (default 128)"
    )
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens per request (default 256)")
    parser.add_argument(
        "--shared-prefix",
        action="store_true",
        help="let all prompts share one prefix (prefix caches can hit); default: each differs from the start",
    )
    parser.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="extra request header, e.g. -H 'X-Latency-Sensitive: 1' (repeatable)",
    )
    parser.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="connect and per-read timeout in seconds (default 60)",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write a JSON summary to OUT")
    parser.add_argument(
        "--plot", type=Path, default=None, metavar="OUT.png", help="write TTFT and tokens/s histograms"
    )


def main(args: argparse.Namespace) -> int:
    """Run ``latgate bench``; returns the exit status."""
    try:
        config = config_from_args(args)
        for path in (args.json, args.plot):
            _check_writable(path)
        if args.plot is not None:
            ensure_plotting_available()
    except (BenchUsageError, PlotUnavailableError) as exc:
        _error(str(exc))
        return 2

    with BenchProgress(total=config.requests) as progress:
        result = _run(config, progress)
    summary = summarize_samples(result.samples, duration_seconds=result.duration_seconds)
    render_report(Console(highlight=False, markup=False), config, result, summary)

    try:
        if args.json is not None:
            write_json(args.json, build_report_document(config, result, summary))
        if args.plot is not None:
            write_plot(args.plot, result.samples, title=f"{config.model} @ {config.base_url}")
    except OSError as exc:
        _error(f"cannot write {exc.filename}: {exc.strerror}")
        return 1

    if summary.succeeded == 0:
        _error(f"all {summary.requests} requests failed; first: {first_error_line(result)}")
        return 1
    return 0


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Validate the parsed arguments into a BenchConfig. Raises BenchUsageError."""
    for option, value, minimum in (
        ("-n/--requests", args.requests, 1),
        ("-c/--concurrency", args.concurrency, 1),
        ("--prompt-tokens", args.prompt_tokens, 1),
        ("--max-tokens", args.max_tokens, 1),
    ):
        if value < minimum:
            raise BenchUsageError(f"{option} must be at least {minimum}, got {value}")
    if not args.timeout > 0:
        raise BenchUsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if not args.model.strip():
        raise BenchUsageError("--model must not be empty")
    try:
        base_url = normalize_base_url(args.base_url)
    except ValueError as exc:
        raise BenchUsageError(str(exc)) from None
    return BenchConfig(
        base_url=base_url,
        model=args.model,
        requests=args.requests,
        concurrency=args.concurrency,
        stream=args.stream,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        headers=tuple(parse_header(raw) for raw in args.header),
        api_key=args.api_key if args.api_key is not None else os.environ.get("OPENAI_API_KEY") or None,
        timeout_seconds=args.timeout,
        shared_prefix=args.shared_prefix,
        run_id=secrets.token_hex(4),
    )


def parse_header(raw: str) -> tuple[str, str]:
    """``'Name: value'`` -> ``("Name", "value")``. Raises BenchUsageError on bad syntax."""
    name, sep, value = raw.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not _HEADER_NAME.match(name):
        raise BenchUsageError(f"-H expects 'Name: value' with a valid header name, got {raw!r}")
    if any(ch in value for ch in "\r\n\0"):
        raise BenchUsageError(f"-H value must be one line, got {raw!r}")
    return name, value


def _run(config: BenchConfig, progress: BenchProgress) -> BenchResult:
    coroutine = run_bench(config, on_sample=progress.update)
    try:
        import uvloop  # a faster event loop keeps the client's own overhead down
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def _check_writable(path: Path | None) -> None:
    if path is not None and not path.parent.is_dir():
        raise BenchUsageError(f"cannot write {path}: directory {path.parent} does not exist")


def _error(message: str) -> None:
    print(f"latgate: error: {message}", file=sys.stderr)
