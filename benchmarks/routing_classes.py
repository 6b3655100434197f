"""Priority classes on a full pool: interactive agent turns with budgets beside a batch
flood from another key, on a pool of fixed capacity (issue 22's targets).

    .venv/bin/python benchmarks/routing_classes.py [--duration 60] [--scale 1.0]
        [--systems latgate-classes,latgate-fifo,litellm,vllm-router] [--json OUT.json]

Loopback, three processes: the simulator (``latgate.commands.sim``, one vLLM-style engine with
8 batch slots, 40 ms to first token, 20 ms a token, queueing beyond its slots in
arrival order), the router under test, and this load generator (open loop, seeded
Poisson arrivals, streams). Two keys:

- ``quiet``: interactive turns, 2/s, ``X-Latgate-Priority: interactive`` and
  ``X-Latency-Budget-Ms: 1500``, 16 tokens; and its own batch jobs, 1/s, 32 tokens;
- ``flood``: batch jobs (``X-Latgate-Priority: batch``, 32 tokens) at the rate that
  makes the offered load 1.5x the pool's capacity (8 slots / ~0.7 s a job: ~11 jobs/s).

``--scale`` multiplies every rate (0.5 for a lighter machine); ``--duration`` is the
trace's length. Systems, each on fresh processes and the same arrivals:
``latgate-classes`` (the gateway queue: classes, fair shares, shedding),
``latgate-fifo`` (``[routing.queue] enabled = false``: the engine's own queue), and the
peers LiteLLM and vllm-router where ``benchmarks/setup_peers.sh`` installed them. Two
reference runs on ``latgate-classes``: the quiet key alone (its interactive turns' p99
TTFT on a pool with room is the "idle" value, and its all-requests p99 the "alone" one).

Reported per system: interactive first tokens within budget (failures are misses), its
p99 TTFT and the ratio to idle; the quiet key's p99 TTFT and the ratio to alone; batch
requests served, shed (503 with ``Retry-After``) and failed otherwise, and batch
throughput (completion tokens/s) as a share of what the pool has left after the
interactive traffic (its 8 slots x 50 tokens/s, less the interactive tokens), and the
machine's 1-minute load average as the system's run started and ended (``load_1m``).
Targets (issue 22): >= 95% within budget, p99 <= 1.5x idle; every batch request served
or shed, batch throughput >= 80% of what is left; quiet p99 <= 1.5x alone. Numbers are
of one run on a shared machine: compare the rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from harness import (
    PEER_SYSTEMS,
    fill,
    peer_missing,
    percentile,
    poisson_times,
    rounded,
    router,
    simulators,
    write_json,
)

UP_TIMEOUT_S = 90.0
"""A loaded 2-core machine can take longer than the default 20 s to start a gateway."""

SLOTS = 8
TTFT_MS = 40.0
TPOT_MS = 20.0
BUDGET_MS = 1500
INTERACTIVE_TOKENS = 16
BATCH_TOKENS = 32
SIMS = {
    "pool": {
        "ttft_overhead_ms": TTFT_MS, "tpot_ms": TPOT_MS, "tpot_growth_ms": 0.0, "prefill_tokens_per_second": 200_000.0,
        "max_batch_size": SLOTS,
    }
}  # fmt: skip
CONFIG = """
[defaults]
timeout_sec = 120
max_retries = 1
[providers.pool]
api_base = "{pool}/v1"
connector = "vllm"
models = ["m"]
max_batch_size = %d
[routing]
strategy = "latgate"
[routing.queue]
enabled = %s
batch_max_wait_ms = 8000
[health]
probe_interval_sec = 2
load_interval_sec = 0.5
[[auth.keys]]
name = "quiet"
key = "sk-quiet"
[[auth.keys]]
name = "flood"
key = "sk-flood"
"""
SYSTEMS = ("latgate-classes", "latgate-fifo", *PEER_SYSTEMS)


@dataclass(slots=True)
class Arrival:
    """One request: when (s from the start), which key, class, and its body."""

    at_s: float
    key: str
    kind: str  # interactive, batch
    body: bytes


@dataclass(slots=True)
class Outcome:
    """What the client saw of one request."""

    key: str
    kind: str
    status: int
    shed: bool  # refused with Retry-After
    ttft_s: float | None
    tokens: int
    complete: bool
    sent_at_s: float = 0.0
    reason: str = ""  # X-Latgate-Route-Reason (latgate only)
    queue_ms: int | None = None  # X-Latgate-Queue-Ms (latgate only)
    retry_after: str | None = None  # Retry-After on a refusal


def job_seconds() -> float:
    return (TTFT_MS + BATCH_TOKENS * TPOT_MS) / 1000.0


def make_trace(*, seed: int, duration_s: float, scale: float, flood: bool = True) -> list[Arrival]:
    """Poisson arrivals of each stream (see the module docstring)."""
    rng = random.Random(seed)
    capacity_per_s = SLOTS / job_seconds()
    streams = [("quiet", "interactive", 2.0 * scale, INTERACTIVE_TOKENS), ("quiet", "batch", 1.0 * scale, BATCH_TOKENS)]
    if flood:
        streams.append(("flood", "batch", max(0.0, 1.5 * capacity_per_s * scale - 3.0 * scale), BATCH_TOKENS))
    trace = []
    for key, kind, rate, tokens in streams:
        for t in poisson_times(rng, duration_s=duration_s, rate=rate):
            words = " ".join(rng.choice(("fix", "test", "route", "pool", "token", "build")) for _ in range(rng.randint(20, 60)))
            body = {"model": "m", "messages": [{"role": "user", "content": words}], "max_tokens": tokens, "stream": True}
            trace.append(Arrival(at_s=t, key=key, kind=kind, body=orjson.dumps(body)))
    return sorted(trace, key=lambda a: a.at_s)


async def send(session: aiohttp.ClientSession, url: str, arrival: Arrival) -> Outcome:
    headers = {
        "content-type": "application/json",
        "authorization": f"Bearer sk-{arrival.key}",
        "x-latgate-priority": arrival.kind,
    }
    if arrival.kind == "interactive":
        headers["x-latency-budget-ms"] = str(BUDGET_MS)
    started = time.perf_counter()
    ttft = None
    tokens = 0
    complete = False
    try:
        async with session.post(url, data=arrival.body, headers=headers) as response:
            if response.status != 200:
                await response.read()
                after = response.headers.get("retry-after")
                return Outcome(arrival.key, arrival.kind, response.status, after is not None, None, 0, False, arrival.at_s, retry_after=after)
            reason = response.headers.get("x-latgate-route-reason", "")
            queue_ms = response.headers.get("x-latgate-queue-ms")
            async for line in response.content:
                if line.startswith(b"data: [DONE]"):
                    complete = True
                elif line.startswith(b"data: ") and (b'"content": "' in line or b'"content":"' in line):
                    tokens += 1
                    if ttft is None:
                        ttft = time.perf_counter() - started
            waited = int(queue_ms) if queue_ms and queue_ms.isdigit() else None
            return Outcome(arrival.key, arrival.kind, 200, False, ttft, tokens, complete, arrival.at_s, reason, waited)
    except (aiohttp.ClientError, TimeoutError):
        return Outcome(arrival.key, arrival.kind, 0, False, None, 0, False, arrival.at_s)


async def run_trace(base: str, trace: list[Arrival]) -> tuple[list[Outcome], float]:
    url = base + "/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=180)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        started = loop.time()
        tasks = []
        for arrival in trace:
            delay = started + arrival.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(session, url, arrival)))
        outcomes = list(await asyncio.gather(*tasks))
        return outcomes, loop.time() - started


def summarize(outcomes: list[Outcome], wall_s: float, *, idle_p99: float | None, alone_p99: float | None) -> dict[str, Any]:
    interactive = [o for o in outcomes if o.kind == "interactive"]
    batch = [o for o in outcomes if o.kind == "batch"]
    quiet = [o for o in outcomes if o.key == "quiet"]
    within = sum(1 for o in interactive if o.complete and o.ttft_s is not None and o.ttft_s <= BUDGET_MS / 1000.0)
    i_p99 = percentile([o.ttft_s for o in interactive if o.ttft_s is not None], 99)
    q_p99 = percentile([o.ttft_s for o in quiet if o.ttft_s is not None], 99)
    served = sum(1 for o in batch if o.complete)
    shed = sum(1 for o in batch if o.status == 503 and o.shed)
    left_tok_s = SLOTS * 1000.0 / TPOT_MS - sum(o.tokens for o in interactive) / wall_s
    batch_tok_s = sum(o.tokens for o in batch if o.complete) / wall_s
    return {
        "interactive": len(interactive),
        "interactive_within_budget": round(within / len(interactive), 4) if interactive else None,
        "interactive_ttft_p99_s": rounded(i_p99),
        "interactive_p99_vs_idle": _ratio(i_p99, idle_p99),
        "quiet_ttft_p99_s": rounded(q_p99),
        "quiet_p99_vs_alone": _ratio(q_p99, alone_p99),
        "batch": len(batch),
        "batch_served": served,
        "batch_shed": shed,
        "batch_failed": len(batch) - served - shed,
        "batch_tok_s": round(batch_tok_s, 1),
        "batch_share_of_left": round(batch_tok_s / left_tok_s, 3) if left_tok_s > 0 else None,
        "wall_s": round(wall_s, 1),
    }


def _ratio(value: float | None, reference: float | None) -> float | None:
    return None if value is None or not reference else round(value / reference, 2)


@contextlib.contextmanager
def _running(system: str) -> Iterator[str]:
    """Fresh simulator and ``system`` in front of it; yields the router's URL. vllm-router
    takes ``round_robin`` for this one-engine pool (its ``power_of_two`` refuses fewer
    than 2 workers)."""
    with simulators(SIMS, up_timeout_s=UP_TIMEOUT_S) as urls:
        enabled = "false" if system == "latgate-fifo" else "true"
        config = fill(CONFIG % (SLOTS, enabled), urls)
        name = "latgate" if system.startswith("latgate") else system
        policy = "round_robin" if name == "vllm-router" else None
        with router(name, list(urls.values()), config=config, policy=policy, up_timeout_s=UP_TIMEOUT_S) as base:
            yield base


def run(*, seed: int, duration_s: float, scale: float, systems: list[str], dump: Any = None) -> dict[str, Any]:
    """The reference runs, then every system on the same arrivals; the JSON document.
    ``dump``: a path to write each request's outcome to (JSON lines), or None."""
    alone = make_trace(seed=seed, duration_s=min(duration_s, 30.0), scale=scale, flood=False)
    with _running("latgate-classes") as base:
        load_before = os.getloadavg()[0]
        outcomes, _ = asyncio.run(run_trace(base, alone))
        alone_load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    idle_p99 = percentile([o.ttft_s for o in outcomes if o.kind == "interactive" and o.ttft_s is not None], 99)
    alone_p99 = percentile([o.ttft_s for o in outcomes if o.ttft_s is not None], 99)
    print(f"quiet key alone: interactive p99 {rounded(idle_p99)} s, all p99 {rounded(alone_p99)} s", flush=True)
    trace = make_trace(seed=seed, duration_s=duration_s, scale=scale)
    rows: dict[str, Any] = {}
    for system in systems:
        missing = peer_missing(system) if system in PEER_SYSTEMS else None
        if missing:
            rows[system] = {"skipped": missing}
            print(f"{system}: {missing}", flush=True)
            continue
        with _running(system) as base:
            load_before = os.getloadavg()[0]
            outcomes, wall = asyncio.run(run_trace(base, trace))
            load_after = os.getloadavg()[0]
        rows[system] = summarize(outcomes, wall, idle_p99=idle_p99, alone_p99=alone_p99)
        rows[system]["load_1m"] = [round(load_before, 2), round(load_after, 2)]
        if dump is not None:
            with open(dump, "a") as out:
                out.writelines(json.dumps({"system": system, **dataclasses.asdict(o)}) + "\n" for o in outcomes)
        print(f"{system}: {json.dumps(rows[system])}", flush=True)
    counts = {kind: sum(1 for a in trace if a.kind == kind) for kind in ("interactive", "batch")}
    scenario = {"seed": seed, "duration_s": duration_s, "scale": scale, "slots": SLOTS, "budget_ms": BUDGET_MS, "mix": counts}
    return {
        "scenario": scenario, "idle_p99_s": rounded(idle_p99), "alone_p99_s": rounded(alone_p99),
        "alone_load_1m": alone_load, "systems": rows,
    }  # fmt: skip


def table(document: dict[str, Any]) -> str:
    lines = [
        "| system | interactive within budget | interactive p99 (x idle) | quiet key p99 (x alone) | batch served / shed / failed | batch tok/s (share of left) | load (1 min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in document["systems"].items():
        if "skipped" in row:
            lines.append(f"| `{name}` | {row['skipped']} | | | | | |")
            continue
        lines.append(
            f"| `{name}` | {row['interactive_within_budget']:.1%} | {row['interactive_ttft_p99_s']} s ({row['interactive_p99_vs_idle']}x) "
            f"| {row['quiet_ttft_p99_s']} s ({row['quiet_p99_vs_alone']}x) | {row['batch_served']} / {row['batch_shed']} / {row['batch_failed']} "
            f"| {row['batch_tok_s']} ({row['batch_share_of_left']}) | {row['load_1m'][0]}-{row['load_1m'][1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``routing_classes.py [--duration S] [--scale X] [--seed N] [--systems ...] [--json OUT]``."""
    parser = argparse.ArgumentParser(prog="routing_classes.py")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--dump", type=Path, help="each request's outcome, JSON lines")
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        print(f"routing_classes.py: unknown system {unknown[0]!r}; choose from {', '.join(SYSTEMS)}")
        return 2
    document = run(seed=args.seed, duration_s=args.duration, scale=args.scale, systems=systems, dump=args.dump)
    print()
    print(table(document))
    if args.json:
        write_json(args.json, document)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
