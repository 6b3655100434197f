"""A TileRT pool under latency-sensitive bursts: deadline-aware admission on and off.

    .venv/bin/python benchmarks/tilert_admission.py [--json OUT.json] [--duration S] [--seed N]
    .venv/bin/python benchmarks/tilert_admission.py --burst [--rounds N]   (the issue-22 case, below)

``--burst``: the case of issue 22, against a stand-in written from TileRT 0.1.5's
PD-router interface: 2 decode nodes, one request per node, 40 ms to first token, 8 ms a
token, 40 tokens (a node is busy ~360 ms a request), a vLLM overflow pool at ~175 ms to
first token. After a warm-up of sequential requests (leases and TTFT learnt), rounds of
5 concurrent latency-sensitive streams with a 500 ms budget, 1.5 s apart. Reported per
system: each round's first-token times with where each went (``waited``, ``node`` at
once, ``overflow``), and ``held_late``: held requests whose first token came after the
budget while the overflow pool's first tokens in the same run came within it (target 0).

Loopback, three processes: the simulators on one event loop (``latgate.commands.sim``), the
gateway (``latgate serve``), and this load generator.

- ``tile-rt``: TileRT's PD router (sim profile ``tilert``) with 2 decode nodes: 25 ms
  to first token for a short prompt (vLLM-like prefill, then the decode start), 4 ms
  per token; one request per node, 429 "all decode nodes busy" when both are taken.
- ``vllm``: a throughput pool, 16 slots, 220 ms to first token (a busy engine with
  chunked prefill), 20 ms per token, taking the ordinary traffic.
- ``hosted``: 400 ms to first token, 15 ms per token.

The trace (seeded, open loop): every ~0.8 s a burst of 3 to 6 latency-sensitive
streams within 30 ms (``X-Latency-Budget-Ms: 200``, short prompts, 24 tokens), more than
the 2 nodes; ordinary streams (about 1 000-token prompts, 40 tokens) at 3/s beside them.
Every system gets fresh processes and the same trace:

- ``admission``: strategy ``latgate``, ``[routing] admission = true`` (the default);
- ``no-admission``: strategy ``latgate``, ``admission = false``;
- ``round_robin``, ``least_outstanding``: the baselines (no admission; a busy 429
  still overflows at once).

Reported per system: ``slo_attainment`` (latency-sensitive requests whose first token
came within 200 ms; failures are misses), their TTFT p50 / p99, how many were answered
by another pool than ``tile-rt`` (``spilled``), how many waited for a node (route
reason ``waited:tile-rt``) and the wait's mean and max (the gateway's
``latgate_queue_wait_seconds``), declines, and errors. Target: with admission,
attainment at least as high as without and latency-sensitive p99 TTFT no worse, with
fewer requests spilled to the slow pools. Numbers are of this one run on a shared
machine: compare the rows, not runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from harness import Arrival, Result, percentile, send, sims_and_gateway

BUDGET_MS = 200
SYSTEMS = {
    "admission": ("latgate", True),
    "no-admission": ("latgate", False),
    "round_robin": ("round_robin", False),
    "least_outstanding": ("least_outstanding", False),
}
SIMS: dict[str, dict[str, Any]] = {
    "tile-rt": {"profile": "tilert", "decode_nodes": 2, "ttft_overhead_ms": 20.0, "tpot_ms": 4.0, "tpot_growth_ms": 0.0, "prefill_tokens_per_second": 20_000.0},
    "vllm": {"ttft_overhead_ms": 220.0, "tpot_ms": 20.0, "tpot_growth_ms": 0.1, "prefill_tokens_per_second": 20_000.0, "max_batch_size": 16},
    "hosted": {"ttft_overhead_ms": 400.0, "tpot_ms": 15.0, "tpot_growth_ms": 0.0, "prefill_tokens_per_second": 100_000.0, "max_batch_size": 512},
}  # fmt: skip
CONFIG = """
[server]
host = "127.0.0.1"

[defaults]
timeout_sec = 60
connect_timeout_sec = 2
max_retries = 1

[health]
load_interval_sec = 0.5

[providers.tile-rt]
api_base = "{tile-rt}/v1"
connector = "tile_rt_connector"
role = "decode"
models = ["agent-model"]
max_batch_size = 8

[providers.vllm]
api_base = "{vllm}/v1"
connector = "vllm"
role = "prefill"
models = ["agent-model"]
max_batch_size = 16

[providers.hosted]
api_base = "{hosted}/v1"
role = "upstream"
models = ["agent-model"]

[routing]
strategy = "{strategy}"
admission = {admission}
default_route = "vllm"
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
fallbacks = {{ "tile-rt" = ["vllm", "hosted"], "vllm" = ["hosted"] }}
"""


def make_trace(*, seed: int, duration_s: float) -> list[Arrival]:
    """Latency-sensitive bursts larger than the node count, ordinary streams beside them."""
    rng = random.Random(seed)
    trace: list[Arrival] = []
    t = 0.5
    while t < duration_s:
        for _ in range(rng.randint(3, 6)):
            trace.append(_arrival("ls", t + rng.uniform(0.0, 0.03), rng))
        t += rng.uniform(0.6, 1.0)
    t = 0.0
    while True:
        t += rng.expovariate(3.0)
        if t >= duration_s:
            break
        trace.append(_arrival("ordinary", t, rng))
    return sorted(trace, key=lambda a: a.at_s)


def _arrival(kind: str, at_s: float, rng: random.Random) -> Arrival:
    words = rng.randint(8, 30) if kind == "ls" else rng.randint(600, 900)
    text = " ".join(rng.choice(("code", "test", "build", "route", "token", "pool", "fix")) for _ in range(words))
    body = {
        "model": "agent-model",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 24 if kind == "ls" else 40,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-latency-budget-ms": str(BUDGET_MS)} if kind == "ls" else {}
    return Arrival(at_s=at_s, kind=kind, body=orjson.dumps(body), headers=headers)


@contextlib.contextmanager
def running(system: str):
    """Fresh simulators and a gateway for ``system``; yields the gateway URL."""
    strategy, admission = SYSTEMS[system]
    config = CONFIG.replace("{strategy}", strategy).replace("{admission}", "true" if admission else "false")
    with sims_and_gateway(SIMS, config) as (base, _):
        yield base


async def run_trace(base: str, trace: list[Arrival]) -> list[Result]:
    url = base + "/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        started = asyncio.get_running_loop().time()
        tasks = []
        for arrival in trace:
            delay = started + arrival.at_s - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(session, url, arrival)))
        return list(await asyncio.gather(*tasks))


def gateway_admission(base: str) -> dict[str, float]:
    """The gateway queue's counters (``latgate_queue_wait_seconds``): waits that got a
    slot (count, sum), and requests sent elsewhere after a wait (``timed_out``) or at
    once (``declined``)."""
    import httpx

    text = httpx.get(base + "/metrics", timeout=5).text
    out = {"wait_count": 0.0, "wait_sum_s": 0.0, "timed_out": 0.0, "declined": 0.0}
    overflow_count = overflow_sum = 0.0
    for line in text.splitlines():
        value = line.split()[-1] if line.startswith("latgate_queue_wait_seconds") else None
        if value is None:
            continue
        if line.startswith("latgate_queue_wait_seconds_count") and 'outcome="admitted"' in line:
            out["wait_count"] += float(value)
        elif line.startswith("latgate_queue_wait_seconds_sum") and 'outcome="admitted"' in line:
            out["wait_sum_s"] += float(value)
        elif line.startswith("latgate_queue_wait_seconds_count") and 'outcome="overflow"' in line:
            overflow_count += float(value)
        elif line.startswith('latgate_queue_wait_seconds_bucket') and 'outcome="overflow"' in line and 'le="0.005"' in line:
            overflow_sum += float(value)  # sent on at once (a wait of 0)
    out["declined"] = overflow_sum
    out["timed_out"] = overflow_count - overflow_sum
    return out


def summarize(results: list[Result], admission: dict[str, float]) -> dict[str, Any]:
    ls = [r for r in results if r.kind == "ls"]
    within = sum(1 for r in ls if r.ok and r.ttft_s is not None and r.ttft_s <= BUDGET_MS / 1000.0)
    ttft = [r.ttft_s for r in ls if r.ok and r.ttft_s is not None]
    waited = [r for r in ls if (r.reason or "").startswith("waited:")]
    count = admission["wait_count"]
    return {
        "slo_attainment": round(within / len(ls), 4) if ls else None,
        "ls_ttft_p50_s": _r(percentile(ttft, 50)),
        "ls_ttft_p99_s": _r(percentile(ttft, 99)),
        "ls_requests": len(ls),
        "spilled": sum(1 for r in ls if r.ok and r.provider != "tile-rt"),
        "waited": len(waited),
        "wait_mean_ms": round(admission["wait_sum_s"] * 1000.0 / count, 1) if count else None,
        "wait_timed_out": int(admission["timed_out"]),
        "declined": int(admission["declined"]),
        "ls_providers": _count(r.provider or "none" for r in ls),
        "errors": sum(1 for r in results if not r.ok),
        "requests": len(results),
    }


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[value] = out.get(value, 0) + 1
    return out


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| system | within 200 ms | LS TTFT p50 / p99 | spilled | waited (mean wait) | declined | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        wait = f"{row['waited']} ({row['wait_mean_ms']} ms)" if row["waited"] else "0"
        lines.append(
            f"| `{name}` | {row['slo_attainment']:.1%} | {row['ls_ttft_p50_s']:.3f} s / {row['ls_ttft_p99_s']:.3f} s "
            f"| {row['spilled']} of {row['ls_requests']} | {wait} | {row['declined']} | {row['errors']} |"
        )
    return "\n".join(lines)


def run(*, seed: int, duration_s: float, systems: list[str]) -> dict[str, Any]:
    """Every system on the same trace; the JSON document."""
    trace = make_trace(seed=seed, duration_s=duration_s)
    rows: dict[str, dict[str, Any]] = {}
    for system in systems:
        with running(system) as base:
            results = asyncio.run(run_trace(base, trace))
            rows[system] = summarize(results, gateway_admission(base))
        print(f"{system}: {json.dumps(rows[system])}", flush=True)
    kinds = _count(a.kind for a in trace)
    return {"scenario": {"seed": seed, "duration_s": duration_s, "budget_ms": BUDGET_MS, "mix": kinds}, "systems": rows}


BURST_SIMS: dict[str, dict[str, Any]] = {
    "tile-rt": {"profile": "tilert", "decode_nodes": 2, "ttft_overhead_ms": 40.0, "tpot_ms": 8.0, "tpot_growth_ms": 0.0, "prefill_tokens_per_second": 200_000.0},
    "vllm": {"ttft_overhead_ms": 150.0, "tpot_ms": 10.0, "tpot_growth_ms": 0.0, "prefill_tokens_per_second": 200_000.0, "max_batch_size": 64},
    "hosted": {"ttft_overhead_ms": 400.0, "tpot_ms": 15.0, "tpot_growth_ms": 0.0, "max_batch_size": 512},
}  # fmt: skip
BURST_BUDGET_MS = 500


def _burst_arrival(at_s: float) -> Arrival:
    body = {"model": "agent-model", "messages": [{"role": "user", "content": "fix the test"}], "max_tokens": 40, "stream": True}
    headers = {"x-latency-sensitive": "1", "x-latency-budget-ms": str(BURST_BUDGET_MS)}
    return Arrival(at_s=at_s, kind="ls", body=orjson.dumps(body), headers=headers)


def run_burst(*, rounds: int, systems: list[str]) -> dict[str, Any]:
    """The issue-22 case under each system: warm-up, then ``rounds`` bursts of 5."""
    out: dict[str, Any] = {}
    for system in systems:
        strategy, admission = SYSTEMS[system]
        config = CONFIG.replace("{strategy}", strategy).replace("{admission}", "true" if admission else "false")
        with sims_and_gateway(BURST_SIMS, config) as (base, _):
            warm = [_burst_arrival(0.4 * i) for i in range(6)]
            asyncio.run(run_trace(base, warm))
            trace = [_burst_arrival(1.5 * r + 0.002 * i) for r in range(rounds) for i in range(5)]
            results = asyncio.run(run_trace(base, trace))
        rows = []
        for index, result in enumerate(results):
            where = "overflow" if (result.reason or "").startswith("overflow") else "waited" if (result.reason or "").startswith("waited") else "node"
            rows.append({"round": index // 5, "where": where, "provider": result.provider, "ttft_s": _r(result.ttft_s), "ok": result.ok})
        budget_s = BURST_BUDGET_MS / 1000.0
        overflow_ttft = [r["ttft_s"] for r in rows if r["where"] == "overflow" and r["ttft_s"] is not None]
        overflow_meets = bool(overflow_ttft) and (percentile(overflow_ttft, 50) or 0.0) <= budget_s
        held = [r for r in rows if r["where"] == "waited"]
        out[system] = {
            "requests": rows,
            "within_budget": sum(1 for r in rows if r["ok"] and r["ttft_s"] is not None and r["ttft_s"] <= budget_s),
            "held": len(held),
            "held_late": sum(1 for r in held if (r["ttft_s"] or math.inf) > budget_s) if overflow_meets else 0,
            "held_ttft_max_s": max((r["ttft_s"] or 0.0 for r in held), default=None),
            "overflow_ttft_p50_s": _r(percentile(overflow_ttft, 50)),
        }
        print(f"{system}: " + json.dumps({k: v for k, v in out[system].items() if k != "requests"}), flush=True)
        for r in range(rounds):
            cells = [f"{row['where']} {row['ttft_s']}" for row in rows if row["round"] == r]
            print(f"  round {r}: " + ", ".join(cells))
    return out


def main(argv: list[str]) -> int:
    """``tilert_admission.py [--json OUT] [--duration S] [--seed N] [--burst [--rounds N]]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="tilert_admission.py")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--burst", action="store_true", help="the issue-22 case: bursts of 5 on 2 nodes, 500 ms budget")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.burst:
        document = run_burst(rounds=args.rounds, systems=[s for s in systems if s in ("admission", "no-admission")])
        if args.json:
            args.json.write_text(json.dumps(document, indent=2) + "\n")
        return 0
    document = run(seed=args.seed, duration_s=args.duration, systems=systems)
    print()
    print(table(document["systems"]))
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
