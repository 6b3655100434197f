"""Sends a bench run's requests: N chat completions at concurrency C.

One pool of kept-alive connections (at most C: latgate's own HTTP/1.1 client,
:class:`~latgate.transport.h1.H1Pool`, the one that carries proxied requests) and C worker
tasks that take the next request number until N are sent. Each request is timed by a
``SampleRecorder`` from just before it is sent. The client is kept cheap because its
own per-chunk cost adds to the latencies it reports: bodies are built before the clock
starts, each network read is split into SSE events on bytes and each event is parsed
once with ``orjson``. Transport errors are mapped to ``error_kind`` values here and
nowhere else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from latgate.commands.bench.sample import RequestSample, SampleRecorder
from latgate.commands.bench.sse import SseDecoder
from latgate.commands.bench.workload import Workload, WorkloadSpec
from latgate.transport.errors import UpstreamFailure
from latgate.transport.h1 import H1Pool

Clock = Callable[[], float]
SampleCallback = Callable[[RequestSample], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig(WorkloadSpec):
    """What to send (the bodies: :class:`WorkloadSpec`'s fields) and how (validated by
    the CLI; see ``normalize_base_url``).

    ``base_url`` ends with ``/v1``; requests go to ``{base_url}/chat/completions``.
    ``headers`` are extra request headers, sent as given. ``timeout_seconds`` bounds
    connecting and each read (time to the first byte, and any gap between chunks); it
    does not bound the whole response.
    """

    base_url: str
    requests: int
    concurrency: int
    headers: tuple[tuple[str, str], ...]
    api_key: str | None
    timeout_seconds: float

    @property
    def chat_completions_url(self) -> str:
        return f"{self.base_url}/chat/completions"


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchResult:
    """The samples of a run, ordered by request number, and its wall-clock duration."""

    samples: list[RequestSample]
    duration_seconds: float
    prompt_tokens_estimate: int


def normalize_base_url(url: str) -> str:
    """``url`` without a trailing slash and with ``/v1`` appended unless its path ends so.

    ``http://h:8000`` and ``http://h:8000/v1/`` both become ``http://h:8000/v1``;
    ``https://taotoken.net/api`` becomes ``https://taotoken.net/api/v1``. A full
    endpoint URL (``.../v1/chat/completions``) is cut back to its base.
    Raises ValueError for a URL that is not ``http(s)://host[:port][/path]``.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--base-url must look like http://HOST[:PORT][/v1], got {url!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        raise ValueError(f"--base-url has an invalid port: {url!r}") from None
    if parts.query or parts.fragment:
        raise ValueError(f"--base-url must not have a query or fragment: {url!r}")
    path = parts.path.rstrip("/").removesuffix("/chat/completions")
    if not path.endswith("/v1"):
        path = f"{path}/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


#: ``error_kind`` by :class:`~latgate.transport.errors.UpstreamFailure` kind
_ERROR_KINDS = {"timeout": "timeout", "connect": "connect_error", "read": "read_error"}
_CONNECT_PREFIX = "could not connect to upstream: "


def transport_error(failure: UpstreamFailure, url: str) -> tuple[str, str]:
    """The ``error_kind`` and a short message for a failed request to ``url``, e.g.
    ``("connect_error", "cannot connect to 127.0.0.1:8000: Connection refused")``."""
    kind = _ERROR_KINDS.get(failure.kind, "transport_error")
    message = str(failure)
    if kind == "connect_error" and message.startswith(_CONNECT_PREFIX):
        parts = urlsplit(url)
        reason = message.removeprefix(_CONNECT_PREFIX)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        message = f"cannot connect to {parts.hostname}:{port}: {reason[:1].upper()}{reason[1:]}"
    return kind, message


async def run_bench(
    config: BenchConfig,
    *,
    clock: Clock = time.perf_counter,
    on_sample: SampleCallback | None = None,
) -> BenchResult:
    """Send ``config.requests`` requests, ``config.concurrency`` at a time.

    Parameters:
        config: the run.
        clock: monotonic seconds; ``time.perf_counter`` by default.
        on_sample: called with each sample as its request finishes (progress display).

    Returns the samples ordered by request number. Every failure is recorded in its
    sample (``error_kind``), never raised.
    """
    workload = Workload(config)
    headers = _request_headers(config)
    concurrency = min(config.concurrency, config.requests)
    samples: list[RequestSample] = []
    indexes = iter(range(config.requests))
    pool = H1Pool(connect_timeout_seconds=config.timeout_seconds, ssl_context=None, max_connections=concurrency)
    try:

        async def worker() -> None:
            for index in indexes:  # one shared iterator: each number is taken once
                body = workload.body(index)
                sample = await _send_one(pool, config, body, headers, index=index, clock=clock)
                samples.append(sample)
                if on_sample is not None:
                    on_sample(sample)

        started_at = clock()
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
        duration_seconds = clock() - started_at
    finally:
        pool.close()

    samples.sort(key=lambda sample: sample.index)
    return BenchResult(
        samples=samples,
        duration_seconds=duration_seconds,
        prompt_tokens_estimate=workload.prompt_tokens_estimate,
    )


def _request_headers(config: BenchConfig) -> dict[str, str]:
    # identity: a compressed stream would be buffered by the decompressor and skew timing.
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if config.stream:
        headers["accept"] = "text/event-stream"
    if config.api_key:
        headers["authorization"] = f"Bearer {config.api_key}"
    for name, value in config.headers:
        headers[name.lower()] = value
    return headers


async def _send_one(
    pool: H1Pool,
    config: BenchConfig,
    body: bytes,
    headers: dict[str, str],
    *,
    index: int,
    clock: Clock,
) -> RequestSample:
    recorder = SampleRecorder(index=index, started_at=clock())
    url = config.chat_completions_url
    try:
        response = await pool.post(url=url, payload=body, headers=headers, read_timeout_seconds=config.timeout_seconds)
        try:
            recorder.on_response(status_code=response.status_code, headers=response.headers)
            if response.status_code >= 300:
                recorder.on_error_body(await response.aread())
            elif config.stream and "json" not in response.headers.get("content-type", ""):
                decoder = SseDecoder()
                # Read to the end even after [DONE], so the connection goes back to the pool.
                async for chunk in response.aiter_raw():
                    at = clock()
                    for data in decoder.feed(chunk):
                        recorder.on_event(data, at=at)
                at = clock()
                for data in decoder.flush():
                    recorder.on_event(data, at=at)
            else:  # not streamed, or a server that ignored ``stream: true``
                recorder.on_json_body(await response.aread(), at=clock())
        finally:
            await response.aclose()
    except UpstreamFailure as failure:
        kind, message = transport_error(failure, url)
        recorder.fail(kind=kind, message=message)
    return recorder.finish(at=clock())
