"""Retry storm: one of a pool's two endpoints fails every request; the retry budget keeps
the retries, and so the healthy endpoint's added load, a bounded share (issue 22).

    .venv/bin/python benchmarks/retry_storm.py [--duration 20] [--rate 20] [--json OUT.json]

Loopback, three processes: two simulators (``bad`` answers every generation 500,
``good`` serves: 40 ms to first token, 10 ms a token, 32 slots), latgate in front of
them as one provider of two endpoints (``max_retries = 2``), and this open-loop load
generator (seeded Poisson arrivals, non-streamed, 16 tokens). Two runs on the same
arrivals: ``budget`` (``[routing.queue]`` defaults: retries plus hedges in flight at
most 20 % of the provider's active requests, at least 3) and ``no-budget``
(``retry_budget_percent = 100``, ``retry_budget_min = 100000``).

Reported per run: client requests and their outcomes; attempts each simulator received
(``GET /bench/arrivals``); latgate's retries and the retries the budget refused
(``latgate_retries_total``, ``latgate_retry_budget_exceeded_total``); the retries as a
share of the requests, and the healthy endpoint's added load (the attempts it received
beyond one per request that did not start on the failing one, over those). The circuit
breaker ejects the failing endpoint after its failures either way: the runs differ in
what reaches the healthy one meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
from routing_scenarios import Scenario, running

CONFIG = """
[defaults]
timeout_sec = 30
max_retries = 2
[providers.pool]
endpoints = ["{bad}/v1", "{good}/v1"]
connector = "vllm"
models = ["m"]
max_batch_size = 32
[routing]
strategy = "latgate"
[routing.queue]
%s
[health]
probe_interval_sec = 2
load_interval_sec = 0.5
"""
SIMS = {
    "bad": {"error_rate": 1.0, "ttft_overhead_ms": 40.0, "tpot_ms": 10.0, "max_batch_size": 32},
    "good": {"ttft_overhead_ms": 40.0, "tpot_ms": 10.0, "tpot_growth_ms": 0.0, "max_batch_size": 32},
}
RUNS = {"budget": "", "no-budget": "retry_budget_percent = 100\nretry_budget_min = 100000"}
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "fix the build"}], "max_tokens": 16})


def arrivals(*, seed: int, duration_s: float, rate: float) -> list[float]:
    rng = random.Random(seed)
    times, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return times
        times.append(t)


async def _send(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.post(url, data=BODY, headers={"content-type": "application/json"}) as response:
            await response.read()
            return response.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


async def _load(base: str, times: list[float]) -> list[int]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60)) as session:
        loop = asyncio.get_running_loop()
        started = loop.time()
        tasks = []
        for at in times:
            delay = started + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_send(session, base + "/v1/chat/completions")))
        return list(await asyncio.gather(*tasks))


def run_one(name: str, times: list[float]) -> dict[str, Any]:
    import latgate.foundation.config  # noqa: F401  (first: importing latgate.live.providers alone meets an import cycle)
    from latgate.live.providers.monitor import parse_gauges

    scenario = Scenario(name="retry_storm", sims=SIMS, config=CONFIG % RUNS[name], single_pool=True, budget_ms=1000)
    with running(scenario, "latgate") as (base, urls):
        started = time.monotonic()
        statuses = asyncio.run(_load(base, times))
        wall = time.monotonic() - started
        text = httpx.get(base + "/metrics", timeout=5).text
        received = {sim: len(httpx.get(url + "/bench/arrivals", timeout=5).json()) for sim, url in urls.items()}
    counters = parse_gauges(text, ("latgate_retries_total", "latgate_retry_budget_exceeded_total"))
    requests = len(times)
    retries = counters.get("latgate_retries_total", 0.0)
    base_good = requests - received["bad"]  # requests whose first attempt went to the healthy endpoint
    added = received["good"] - base_good
    return {
        "requests": requests,
        "ok": sum(1 for s in statuses if s == 200),
        "failed": sum(1 for s in statuses if s != 200),
        "attempts_bad": received["bad"],
        "attempts_good": received["good"],
        "retries": int(retries),
        "retries_refused": int(counters.get("latgate_retry_budget_exceeded_total", 0.0)),
        "retries_per_request": round(retries / requests, 3) if requests else None,
        "good_added_load": round(added / base_good, 3) if base_good > 0 else None,
        "wall_s": round(wall, 1),
    }


def main(argv: list[str]) -> int:
    """``retry_storm.py [--duration S] [--rate R] [--seed N] [--json OUT]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="retry_storm.py")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    times = arrivals(seed=args.seed, duration_s=args.duration, rate=args.rate)
    rows = {}
    for name in RUNS:
        rows[name] = run_one(name, times)
        print(f"{name}: {json.dumps(rows[name])}", flush=True)
    print()
    print("| run | requests ok / failed | attempts bad / good | retries (refused) | retries per request | healthy endpoint's added load |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| `{name}` | {r['ok']} / {r['failed']} | {r['attempts_bad']} / {r['attempts_good']} | {r['retries']} ({r['retries_refused']}) "
            f"| {r['retries_per_request']} | {r['good_added_load']} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"duration_s": args.duration, "rate": args.rate, "seed": args.seed, "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
