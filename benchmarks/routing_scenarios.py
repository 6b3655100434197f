"""Routing scenarios: cold start, identical replicas, recovery, a full decode pool, and
unequal capacity under overload, each under latgate's strategies and the peers.

    .venv/bin/python benchmarks/routing_scenarios.py [--scenarios all] [--json OUT.json] [--seed N]
    .venv/bin/python benchmarks/routing_scenarios.py --scenarios identical,recovery --systems latgate,vllm-router

Every scenario starts fresh simulators (``latgate.commands.sim``, one event loop in a child
process) and a fresh router per system, and sends the same requests to each:

- ``cold``: a decode pool ``tile-rt`` (rule target of latency-sensitive requests) and
  ``vllm`` (the default route), providers without roles (so no role prior helps). 20
  ordinary streams first, then 50 latency-sensitive ones one at a time beside ordinary
  ones. Target: the first latency-sensitive request goes to ``tile-rt``; at most 1 in
  50 leaves it (it is idle and healthy throughout).
- ``identical``: two identical replicas, started cold; 40 streams one at a time, then
  80 at concurrency 8. Target: the busiest takes at most 1.3x the least busy's
  requests, in each phase.
- ``recovery``: two replicas, one 10x slower to its first token for its first 5
  requests and normal afterwards; 140 streams at concurrency 2. Target: of the 100
  requests after its 5th, it takes at least 35%.
- ``full``: a decode pool of 4 slots whose streams hold them ~1.3 s, latency-sensitive
  arrivals (200 ms budget) at 6/s beside ordinary ones, for 15 s: the decode pool is
  really full. Target: latgate at least as good as the better baseline.
- ``unequal``: four endpoints of one model, three with 8 slots and one with 2 (told to
  latgate by an ``endpoints`` table), open-loop arrivals at 14/s with 2 s bursts of
  40/s every 8 s, 40% latency-sensitive (500 ms budget); one big endpoint slows down
  (800 ms more to first token, 3x per token) from 10 s to 25 s of the 40 s run.
  Targets: no healthy endpoint ejected, no more failures than ``least_outstanding``,
  latency-sensitive p99 TTFT at most ``least_outstanding``'s.
- ``overflow``: a decode pool of 2 slots (rule target of latency-sensitive requests)
  and two overflow candidates that both meet the 200 ms budget: ``quick`` (the first
  fallback: first token in 5 ms, 25 ms a token) and ``steady`` (60 ms, 2 ms a token).
  10 ordinary streams to each first, then for 15 s latency-sensitive arrivals at 4/s
  (64 tokens each: the decode pool takes under one a second) beside ordinary ones at
  1/s to each candidate. Target: latgate's latency-sensitive p50 e2e latency at most
  half the better baseline's, with its TTFT SLO at least theirs.

Systems: ``latgate``, ``round_robin``, ``least_outstanding`` (latgate's strategies) and,
where ``benchmarks/setup_peers.sh`` installed them, ``litellm`` (LiteLLM proxy,
``routing_strategy: latency-based-routing``) and ``vllm-router`` (``--policy
power_of_two``), in the single-pool scenarios (``identical``, ``recovery``,
``unequal``): the peers have no latency-sensitive rule to honour, so ``cold`` and
``full`` are latgate's strategies only. Which endpoint served each request is read
from the simulators (arrival times), the same for every system. Start-up, the client,
arrivals and percentiles are ``benchmarks/harness.py``'s; the numbers and targets
``benchmarks/routing_report.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from harness import (
    LATGATE_SYSTEMS,
    MODEL,
    PEER_SYSTEMS,
    Arrival,
    Result,
    closed_loop,
    fill,
    open_loop,
    peer_missing,
    poisson_times,
    router,
    simulators,
    write_json,
)
from routing_report import gateway_numbers, summarize, table

CLIENT_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    """One scenario: its simulators (name -> SimOptions fields, plus ``slow_first`` =
    (requests, extra ms) and ``slow_window`` = (from s, to s, options)), the latgate
    config template (``{NAME}`` = a simulator's URL, ``{strategy}``), whether the peers
    apply (one pool), and the budget its SLO counts against."""

    name: str
    sims: dict[str, dict[str, Any]]
    config: str
    single_pool: bool
    budget_ms: int


FAST = {"tpot_ms": 8.0, "tpot_growth_ms": 0.0, "ttft_overhead_ms": 20.0, "default_max_tokens": 16}
TWO_POOLS = """
[defaults]
timeout_sec = 60
max_retries = 1
[providers.tile-rt]
api_base = "{tile-rt}/v1"
connector = "vllm"
models = ["m"]
max_batch_size = {decode_slots}
[providers.vllm]
api_base = "{vllm}/v1"
connector = "vllm"
models = ["m"]
[routing]
strategy = "{strategy}"
default_route = "vllm"
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
fallbacks = {{ "tile-rt" = ["vllm"] }}
[health]
probe_interval_sec = 2
load_interval_sec = 0.5
"""
ONE_POOL = """
[defaults]
timeout_sec = 60
max_retries = 1
[providers.pool]
endpoints = [{endpoints}]
connector = "vllm"
models = ["m"]
[routing]
strategy = "{strategy}"
[health]
probe_interval_sec = 2
load_interval_sec = 0.5
"""


def _one_pool(names: list[str], tables: dict[str, str] | None = None) -> str:
    tables = tables or {}
    entries = [
        f'{{ url = "{{{n}}}/v1", {tables[n]} }}' if n in tables else f'"{{{n}}}/v1"' for n in names
    ]
    return ONE_POOL.replace("{endpoints}", ", ".join(entries))


UNEQUAL_SLOW = {"ttft_overhead_ms": 820.0, "tpot_ms": 60.0}
THREE_POOLS = (
    TWO_POOLS.replace("{decode_slots}", "2")
    .replace('fallbacks = {{ "tile-rt" = ["vllm"] }}', 'fallbacks = {{ "tile-rt" = ["vllm", "steady"] }}')
    .replace("[health]", '[routing.policies.steady]\nroute_to = "steady"\n[providers.steady]\napi_base = "{steady}/v1"\nconnector = "vllm"\nmodels = ["m"]\n[health]')
)
SCENARIOS = {
    "cold": Scenario(
        "cold",
        {"tile-rt": {**FAST, "ttft_overhead_ms": 5.0, "max_batch_size": 8}, "vllm": {**FAST, "max_batch_size": 64}},
        TWO_POOLS.replace("{decode_slots}", "8"),
        single_pool=False,
        budget_ms=200,
    ),
    "identical": Scenario(
        "identical",
        {"a": {**FAST, "max_batch_size": 64}, "b": {**FAST, "max_batch_size": 64}},
        _one_pool(["a", "b"]),
        single_pool=True,
        budget_ms=200,
    ),
    "recovery": Scenario(
        "recovery",
        {"a": {**FAST, "max_batch_size": 64}, "b": {**FAST, "max_batch_size": 64, "slow_first": (5, 180.0)}},
        _one_pool(["a", "b"]),
        single_pool=True,
        budget_ms=200,
    ),
    "full": Scenario(
        "full",
        {
            "tile-rt": {"tpot_ms": 40.0, "tpot_growth_ms": 0.0, "ttft_overhead_ms": 5.0, "max_batch_size": 4, "default_max_tokens": 32},
            "vllm": {**FAST, "max_batch_size": 64},
        },
        TWO_POOLS.replace("{decode_slots}", "4"),
        single_pool=False,
        budget_ms=200,
    ),
    "unequal": Scenario(
        "unequal",
        {
            "u0": {"tpot_ms": 20.0, "tpot_growth_ms": 0.5, "ttft_overhead_ms": 20.0, "max_batch_size": 8, "default_max_tokens": 32},
            "u1": {"tpot_ms": 20.0, "tpot_growth_ms": 0.5, "ttft_overhead_ms": 20.0, "max_batch_size": 8, "default_max_tokens": 32, "slow_window": (10.0, 25.0, UNEQUAL_SLOW)},
            "u2": {"tpot_ms": 20.0, "tpot_growth_ms": 0.5, "ttft_overhead_ms": 20.0, "max_batch_size": 8, "default_max_tokens": 32},
            "u3": {"tpot_ms": 20.0, "tpot_growth_ms": 0.5, "ttft_overhead_ms": 20.0, "max_batch_size": 2, "default_max_tokens": 32},
        },
        _one_pool(["u0", "u1", "u2", "u3"], {"u3": "max_batch_size = 2"}).replace(
            'connector = "vllm"', 'connector = "vllm"\nmax_batch_size = 8'
        ),
        single_pool=True,
        budget_ms=500,
    ),
    "overflow": Scenario(
        "overflow",
        {
            "tile-rt": {"tpot_ms": 20.0, "tpot_growth_ms": 0.0, "ttft_overhead_ms": 5.0, "max_batch_size": 2, "default_max_tokens": 64},
            "vllm": {"tpot_ms": 25.0, "tpot_growth_ms": 0.0, "ttft_overhead_ms": 5.0, "max_batch_size": 64, "default_max_tokens": 64},
            "steady": {"tpot_ms": 2.0, "tpot_growth_ms": 0.0, "ttft_overhead_ms": 60.0, "max_batch_size": 64, "default_max_tokens": 64},
        },
        THREE_POOLS,
        single_pool=False,
        budget_ms=200,
    ),
}  # fmt: skip


# -- start-up -------------------------------------------------------------------------------


@contextlib.contextmanager
def running(scenario: Scenario, system: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The scenario's simulators and ``system`` in front of them; yields (router URL,
    simulator URLs by name)."""
    sims = {name: {k: v for k, v in fields.items() if k != "slow_window"} for name, fields in scenario.sims.items()}
    with simulators(sims) as urls:
        config = fill(scenario.config, {**urls, "strategy": system}) if system in LATGATE_SYSTEMS else None
        with router(system, list(urls.values()), config=config) as base:
            yield base, urls


# -- the requests -----------------------------------------------------------------------------


def _body(rng: random.Random, *, words: int, max_tokens: int) -> bytes:
    text = " ".join(rng.choice(("route", "token", "prompt", "decode", "pool", "agent")) for _ in range(words))
    return orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


def _arrival(rng: random.Random, kind: str, *, at_s: float = 0.0, budget_ms: int = 200, max_tokens: int = 16) -> Arrival:
    headers = {"x-latency-budget-ms": str(budget_ms), "x-latency-sensitive": "1"} if kind == "ls" else {}
    words = rng.randint(20, 60) if kind == "ls" else rng.randint(200, 600)
    return Arrival(at_s=at_s, kind=kind, body=_body(rng, words=words, max_tokens=max_tokens), headers=headers)


async def _set_options(session: aiohttp.ClientSession, url: str, fields: dict[str, Any]) -> None:
    async with session.post(url + "/bench/options", data=orjson.dumps(fields)) as response:
        assert response.status == 200


async def _arrivals(session: aiohttp.ClientSession, urls: dict[str, str]) -> dict[str, list[float]]:
    out = {}
    for name, url in urls.items():
        async with session.get(url + "/bench/arrivals") as response:
            out[name] = orjson.loads(await response.read())
    return out


def _unequal_rate(t: float) -> float:
    """The ``unequal`` scenario's arrivals per second at ``t``: 14, with a 2 s burst of 40
    every 8 s from 3 s on."""
    return 40.0 if t >= 3.0 and (t - 3.0) % 8.0 < 2.0 else 14.0


async def drive(scenario: Scenario, base: str, sims: dict[str, str], seed: int) -> dict[str, Any]:
    """Run ``scenario``'s requests against ``base``; returns its raw observations."""
    url = base + "/v1/chat/completions"
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        before = await _arrivals(session, sims)  # a peer's warm-up request is not counted
        marks: list[float] = []
        results: list[Result] = []
        name = scenario.name
        if name == "cold":
            results += await closed_loop(session, url, [_arrival(rng, "ordinary") for _ in range(20)], 1)
            mixed = [_arrival(rng, kind) for _ in range(50) for kind in ("ls", "ordinary")]
            results += await closed_loop(session, url, mixed, 2)
        elif name == "identical":
            results += await closed_loop(session, url, [_arrival(rng, "ordinary") for _ in range(40)], 1)
            marks.append(time.monotonic())
            results += await closed_loop(session, url, [_arrival(rng, "ordinary") for _ in range(80)], 8)
        elif name == "recovery":
            results += await closed_loop(session, url, [_arrival(rng, "ordinary") for _ in range(140)], 2)
        elif name == "full":
            arrivals = [
                _arrival(rng, "ls" if rng.random() < 0.6 else "ordinary", at_s=t, max_tokens=32)
                for t in poisson_times(rng, duration_s=15.0, rate=10.0)
            ]
            results += await open_loop(session, url, arrivals)
        elif name == "unequal":
            arrivals = [
                _arrival(rng, "ls" if rng.random() < 0.4 else "ordinary", at_s=t, budget_ms=scenario.budget_ms, max_tokens=32)
                for t in poisson_times(rng, duration_s=40.0, rate=_unequal_rate, peak=40.0)
            ]
            slow_from, slow_to, slow = scenario.sims["u1"]["slow_window"]
            normal = {k: scenario.sims["u1"][k] for k in slow}
            controls = [
                (slow_from, lambda: _set_options(session, sims["u1"], slow)),
                (slow_to, lambda: _set_options(session, sims["u1"], normal)),
            ]
            results += await open_loop(session, url, arrivals, controls)
        elif name == "overflow":
            steady = {"x-route-policy": "steady"}
            warm = [_arrival(rng, "ordinary", max_tokens=64) for _ in range(20)]
            warm = [dataclasses.replace(a, headers=steady) if i % 2 else a for i, a in enumerate(warm)]
            results += await closed_loop(session, url, warm, 1)
            arrivals = []
            for t in poisson_times(rng, duration_s=15.0, rate=6.0):
                kind = rng.choice(("ls", "ls", "ls", "ls", "ordinary", "steady"))
                arrival = _arrival(rng, "ordinary" if kind == "steady" else kind, at_s=t, max_tokens=64)
                arrivals.append(dataclasses.replace(arrival, headers=steady) if kind == "steady" else arrival)
            results += await open_loop(session, url, arrivals)
        after = await _arrivals(session, sims)
    seen = {n: after[n][len(before[n]) :] for n in after}
    return {"results": results, "arrivals": seen, "marks": marks}


def run(names: list[str], systems: list[str], *, seed: int) -> dict[str, dict[str, Any]]:
    """Every scenario of ``names`` under every applicable system of ``systems``."""
    document: dict[str, dict[str, Any]] = {}
    for name in names:
        scenario = SCENARIOS[name]
        rows: dict[str, Any] = {}
        for system in systems:
            if system in PEER_SYSTEMS:
                if not scenario.single_pool:
                    continue
                missing = peer_missing(system)
                if missing:
                    rows[system] = {"skipped": missing}
                    continue
            with running(scenario, system) as (base, sims):
                observed = asyncio.run(drive(scenario, base, sims, seed))
                rows[system] = summarize(name, scenario.budget_ms, observed, gateway_numbers(base, system))
            print(f"{name} / {system}: {json.dumps(rows[system])}", flush=True)
        document[name] = rows
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="all", help=f"comma-separated, or all: {', '.join(SCENARIOS)}")
    parser.add_argument(
        "--systems", default=",".join((*LATGATE_SYSTEMS, *PEER_SYSTEMS)), help="the strategies and peers to compare (default: all)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", metavar="OUT", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if args.scenarios == "all" else [n.strip() for n in args.scenarios.split(",") if n.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [n for n in names if n not in SCENARIOS] + [s for s in systems if s not in (*LATGATE_SYSTEMS, *PEER_SYSTEMS)]
    if unknown:
        print(f"routing_scenarios: error: unknown scenario or system {unknown[0]!r}", file=sys.stderr)
        return 2
    started = time.monotonic()
    document = run(names, systems, seed=args.seed)
    print(table(document))
    if args.json:
        write_json(args.json, {"scenarios": document, "wall_seconds": round(time.monotonic() - started, 1)})
    print(f"wall time: {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
