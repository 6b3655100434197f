"""Sends a bench run's requests: N chat completions at concurrency C.

One pooled ``aiohttp.ClientSession`` (at most C connections, kept alive) and C worker
tasks that take the next request number until N are sent. Each request is timed by a
``SampleRecorder`` from just before it is sent. The client is kept cheap because its
own per-chunk cost adds to the latencies it reports: bodies are built before the clock
starts, each network read is split into SSE events on bytes and each event is parsed
once with ``orjson``. aiohttp (its C HTTP parser) costs about a third to a half of
httpx's CPU time per streamed chunk here (measured: ~11 us vs ~25-33 us per chunk
including our parsing), which is why it is used rather than httpx. Transport errors are
mapped to ``error_kind`` values here and nowhere else.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from latgate.bench.sample import RequestSample, SampleRecorder
from latgate.bench.sse import SseDecoder
from latgate.bench.workload import Workload

Clock = Callable[[], float]
SampleCallback = Callable[[RequestSample], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What to send and how (validated by the CLI; see ``normalize_base_url``).

    ``base_url`` ends with ``/v1``; requests go to ``{base_url}/chat/completions``.
    ``headers`` are extra request headers, sent as given. ``timeout_seconds`` bounds
    connecting and each read (time to the first byte, and any gap between chunks):
    aiohttp's ``sock_connect`` and ``sock_read``; it does not bound the whole response.
    """

    base_url: str
    model: str
    requests: int
    concurrency: int
    stream: bool
    prompt_tokens: int
    max_tokens: int
    headers: tuple[tuple[str, str], ...]
    api_key: str | None
    timeout_seconds: float
    shared_prefix: bool
    run_id: str

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


def transport_error_kind(exc: BaseException) -> str:
    """The ``error_kind`` of an aiohttp (or timeout) exception."""
    if isinstance(exc, TimeoutError):
        return "timeout"  # aiohttp's ServerTimeoutError and ConnectionTimeoutError too
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_error"  # refused, unreachable, DNS failure
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        return "read_error"
    return "transport_error"


def transport_error_message(exc: BaseException) -> str:
    """A short description of an aiohttp (or timeout) exception, e.g. for connection refused."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        errno = exc.os_error.errno
        reason = os.strerror(errno) if errno else str(exc.os_error)
        return f"cannot connect to {exc.host}:{exc.port}: {reason}"
    if isinstance(exc, TimeoutError):
        return f"timed out ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})"
    return str(exc) or type(exc).__name__


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
    workload = Workload(
        model=config.model,
        prompt_tokens=config.prompt_tokens,
        max_tokens=config.max_tokens,
        stream=config.stream,
        shared_prefix=config.shared_prefix,
        run_id=config.run_id,
    )
    headers = _request_headers(config)
    concurrency = min(config.concurrency, config.requests)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=config.timeout_seconds, sock_read=config.timeout_seconds
    )
    samples: list[RequestSample] = []
    indexes = iter(range(config.requests))

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:

        async def worker() -> None:
            for index in indexes:  # one shared iterator: each number is taken once
                body = workload.body(index)
                sample = await _send_one(
                    session, config.chat_completions_url, body, index=index, stream=config.stream, clock=clock
                )
                samples.append(sample)
                if on_sample is not None:
                    on_sample(sample)

        started_at = clock()
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
        duration_seconds = clock() - started_at

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
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    index: int,
    stream: bool,
    clock: Clock,
) -> RequestSample:
    recorder = SampleRecorder(index=index, started_at=clock())
    try:
        async with session.post(url, data=body, allow_redirects=False) as response:
            recorder.on_response(status_code=response.status, headers=response.headers)
            if response.status >= 300:
                recorder.on_error_body(await response.read())
            elif stream and "json" not in response.headers.get("content-type", ""):
                decoder = SseDecoder()
                # Read to the end even after [DONE], so the connection goes back to the pool.
                async for chunk in response.content.iter_any():
                    at = clock()
                    for data in decoder.feed(chunk):
                        recorder.on_event(data, at=at)
                at = clock()
                for data in decoder.flush():
                    recorder.on_event(data, at=at)
            else:  # not streamed, or a server that ignored ``stream: true``
                recorder.on_json_body(await response.read(), at=clock())
    except (aiohttp.ClientError, TimeoutError) as exc:
        recorder.fail(kind=transport_error_kind(exc), message=transport_error_message(exc))
    return recorder.finish(at=clock())
