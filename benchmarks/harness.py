"""What every scenario benchmark shares: start-up, arrivals, the streaming client, the
one percentile definition, and reporting.

A scenario is a standalone script (``routing_slo.py``, ``routing_scenarios.py``,
``tilert_admission.py``, ``routing_classes.py``, ``sessions.py``) that imports this
module; no benchmark module imports a scenario script, so ``benchmarks/`` has no import
cycle (``tools/bench_imports.py`` checks it, run by ``tests/test_bench_harness.py``).

- **Start-up** (``benchmarks/startup.py``, re-exported here). :func:`simulators` runs
  ``latgate.commands.sim`` engines on one event loop in a child process, each with a control
  surface (``GET /bench/arrivals``, ``POST /bench/options``, ``slow_first``);
  :func:`router` starts ``latgate serve`` or a peer (LiteLLM proxy, vllm-router,
  installed by ``benchmarks/setup_peers.sh``) in front of them; :func:`sims_and_gateway`
  is both with latgate.
- **Arrivals.** :func:`poisson_times`: seeded Poisson arrival times, with a rate that
  may vary in time (thinning); the caller draws each request from the same generator.
- **Requests.** :class:`Arrival` and :class:`Result`; :func:`send` streams one request
  and records what the client saw (``latgate.commands.bench``'s recorder and SSE decoder);
  :func:`closed_loop` and :func:`open_loop` drive a list of them.
- **Percentiles.** :func:`percentile` is ``latgate bench``'s definition
  (``latgate.commands.bench.stats.percentile``): linear interpolation between the closest ranks
  (Hyndman & Fan type 7, numpy's default). For ascending values ``v`` of length ``n``
  the p-th percentile is at rank ``h = p/100 * (n - 1)``: ``v[floor(h)] + (h -
  floor(h)) * (v[floor(h) + 1] - v[floor(h)])``. Every percentile in ``benchmarks/``
  and ``docs/performance.md`` is this one.
- **Reporting.** :func:`rounded`, :func:`markdown_table`, :func:`write_json` (strict
  JSON: NaN as null).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path

import aiohttp
from startup import (
    LATGATE_SYSTEMS,
    MODEL,
    PEER_SYSTEMS,
    ROOT,
    child_env,
    fill,
    peer_command,
    peer_missing,
    router,
    sims_and_gateway,
    simulators,
    wait_routes,
    wait_until_up,
)

from latgate.commands.bench.stats import percentile as _sorted_percentile

__all__ = [
    "LATGATE_SYSTEMS",
    "MODEL",
    "PEER_SYSTEMS",
    "PERCENTILES",
    "ROOT",
    "Arrival",
    "Result",
    "child_env",
    "closed_loop",
    "fill",
    "markdown_table",
    "open_loop",
    "peer_command",
    "peer_missing",
    "percentile",
    "poisson_times",
    "rounded",
    "router",
    "send",
    "sims_and_gateway",
    "simulators",
    "strict",
    "wait_routes",
    "wait_until_up",
    "write_json",
]

PERCENTILES = "linear interpolation between closest ranks (Hyndman & Fan type 7, numpy's default)"
"""How :func:`percentile` is defined, as the JSON documents record it."""

# -- percentiles ------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float, *, empty: float | None = None) -> float | None:
    """The ``q``-th percentile (0..100) of ``values`` (any order), by linear interpolation
    between the closest ranks (``latgate.commands.bench.stats.percentile``); ``empty`` (None unless
    given, e.g. NaN) when there are no values. Raises ValueError for ``q`` outside 0..100."""
    ordered = sorted(values)
    if not ordered:
        return empty
    return _sorted_percentile(ordered, q)


# -- arrivals ---------------------------------------------------------------------------------


def poisson_times(
    rng: random.Random, *, duration_s: float, rate: float | Callable[[float], float], peak: float | None = None
) -> Iterator[float]:
    """Arrival times (seconds, ascending, below ``duration_s``) of a Poisson process.

    ``rate`` is requests per second, or a function of the time giving it; a function needs
    ``peak`` (its largest value): times are drawn at ``peak`` and each kept with
    probability ``rate(t) / peak`` (thinning). Draws come from ``rng`` lazily, so the
    caller may draw each request's contents from the same generator between times and a
    seed gives the same trace. Raises ValueError for a rate function without ``peak``.
    """
    if callable(rate) and peak is None:
        raise ValueError("a time-varying rate needs its peak")
    draw_rate = peak if callable(rate) else rate
    if draw_rate is None or draw_rate <= 0:
        return
    t = 0.0
    while True:
        t += rng.expovariate(draw_rate)
        if t >= duration_s:
            return
        if callable(rate) and rng.random() * draw_rate > rate(t):
            continue
        yield t


# -- requests ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Arrival:
    """One request of a trace: when it is sent (seconds from the start), its kind (the
    scenario's label, e.g. ``ls``, ``ordinary``, ``long``), its JSON body and headers."""

    at_s: float
    kind: str
    body: bytes
    headers: dict[str, str]


@dataclasses.dataclass(slots=True)
class Result:
    """What the client saw of one request; times are ``time.perf_counter()`` seconds,
    ``ttft_s`` the first content token's delay after sending (None without one)."""

    kind: str
    ok: bool
    ttft_s: float | None
    completion_tokens: int
    provider: str | None
    reason: str | None
    candidates: str | None
    sent_at: float
    done_at: float
    error: str | None


async def send(session: aiohttp.ClientSession, url: str, arrival: Arrival) -> Result:
    """POST ``arrival`` to ``url`` (a chat completions URL) as an SSE stream and read it to
    the end; transport errors and timeouts are a failed :class:`Result`, never raised.
    Provider and route reason come from latgate's response headers (None from a peer)."""
    from latgate.commands.bench.sample import SampleRecorder
    from latgate.commands.bench.sse import SseDecoder

    clock = time.perf_counter
    sent_at = clock()
    recorder = SampleRecorder(index=0, started_at=sent_at)
    headers = {"content-type": "application/json", "accept": "text/event-stream", **arrival.headers}
    candidates = None
    try:
        async with session.post(url, data=arrival.body, headers=headers) as response:
            recorder.on_response(status_code=response.status, headers=response.headers)
            candidates = response.headers.get("x-latgate-route-candidates")
            if response.status >= 300:
                recorder.on_error_body(await response.read())
            else:
                decoder = SseDecoder()
                async for chunk in response.content.iter_any():
                    at = clock()
                    for data in decoder.feed(chunk):
                        recorder.on_event(data, at=at)
    except (aiohttp.ClientError, TimeoutError) as exc:
        recorder.fail(kind="transport_error", message=type(exc).__name__)
    done_at = clock()
    sample = recorder.finish(at=done_at)
    return Result(
        kind=arrival.kind,
        ok=sample.ok,
        ttft_s=None if sample.ttft_ms is None else sample.ttft_ms / 1000.0,
        completion_tokens=sample.completion_tokens or 0,
        provider=sample.provider,
        reason=sample.route_reason,
        candidates=candidates,
        sent_at=sent_at,
        done_at=done_at,
        error=sample.error_kind,
    )


async def closed_loop(session: aiohttp.ClientSession, url: str, arrivals: list[Arrival], concurrency: int) -> list[Result]:
    """Send ``arrivals`` in order, ``concurrency`` at a time (their ``at_s`` unused)."""
    queue = list(reversed(arrivals))
    results: list[Result] = []

    async def worker() -> None:
        while queue:
            results.append(await send(session, url, queue.pop()))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def open_loop(
    session: aiohttp.ClientSession,
    url: str,
    arrivals: list[Arrival],
    controls: Sequence[tuple[float, Callable[[], Awaitable[object]]]] = (),
) -> list[Result]:
    """Send each arrival at its ``at_s`` whatever the answers (open loop); await each
    control (seconds, coroutine factory) at its time, before the arrivals of that time."""
    started = time.perf_counter()
    events = sorted(
        [(a.at_s, 1, i) for i, a in enumerate(arrivals)] + [(at, 0, i) for i, (at, _) in enumerate(controls)]
    )
    tasks = []
    for at_s, kind, index in events:
        delay = started + at_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if kind == 0:
            await controls[index][1]()
        else:
            tasks.append(asyncio.create_task(send(session, url, arrivals[index])))
    return list(await asyncio.gather(*tasks))


# -- reporting --------------------------------------------------------------------------------


def rounded(value: float | None, digits: int = 3) -> float | None:
    """``value`` rounded to ``digits``; None stays None."""
    return None if value is None else round(value, digits)


def strict(value: object) -> object:
    """``value`` with every NaN (a percentile of no samples) as None, so it dumps as strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    return value


def write_json(path: Path, document: object) -> None:
    """Write ``document`` to ``path`` as indented strict JSON (NaN as null)."""
    path.write_text(json.dumps(strict(document), indent=2) + "\n")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table: ``header`` cells, then one line per row (cells as ``str``)."""
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
