"""Latency SLO under load: the same arrival trace through latgate under each routing strategy.

    .venv/bin/python benchmarks/routing_slo.py [--json OUT.json] [--plot OUT.png]
                                              [--duration SECONDS] [--seed N] [--strategies a,b,c]

The other routing benchmarks are scripts of their own: ``routing_scenarios.py``,
``tilert_admission.py``, ``routing_classes.py``, ``retry_storm.py``. Start-up, the client and percentiles
are ``benchmarks/harness.py``'s.

Everything runs on loopback, in three processes: five simulated engines on one event
loop (``latgate.commands.sim``), the gateway (``latgate serve``), and this load generator.

- decode pool ``tile-rt``: 2 endpoints, ``max_batch_size = 8``, 25 ms per token, 3 ms
  to first token plus prefill at 50 000 tokens/s, prefix cache on;
- throughput pool ``vllm``: 2 endpoints, 64 slots, 60 ms per token, 20 ms + prefill at
  20 000 tokens/s;
- hosted-style upstream ``hosted``: 400 ms to first token, 30 ms per token, 512 slots.

(Token times are a few times real ones: on this project's 2-core machine each streamed
chunk costs a few hundred microseconds of CPU across the three processes, so the run
saturates the decode pool with fewer tokens per second than a real one would.)

The trace (seeded, Poisson arrivals: 6 requests/s with a 2 s burst of 60/s every 8 s,
which saturates the decode pool) mixes 40% latency-sensitive short prompts (32 output
tokens) with a 200 ms time-to-first-token budget (``X-Latency-Budget-Ms: 200``, route
policy ``interactive`` with ``hedge = true``) sharing four system prompts, 45% ordinary
requests (1-2k-token prompts) and 15% long-context ones (about 20k tokens, routed to the
hosted upstream). Half-way through, one decode endpoint turns slow (500 ms to first
token, 75 ms per token) but keeps answering. Each strategy gets fresh processes and the
same trace; every request streams with usage.

Reported per strategy (``--json``): ``slo_attainment`` (latency-sensitive requests
answered with a first token within 200 ms, failures counting as misses),
``ls_ttft_p50_s`` / ``ls_ttft_p99_s`` (latency-sensitive), ``all_ttft_p99_s``,
``throughput_tok_s`` (completion tokens over the time from the first request sent to the
last one finished), ``errors``; plus the gateway's overflow, hedge and ejection
counters. The PNG plots each strategy's TTFT distribution (latency-sensitive requests,
and all). Targets: ``latgate`` keeps >= 99% within budget where ``round_robin`` keeps
< 80%, with ``ls_ttft_p99_s`` at most half the best baseline's and throughput within 5%
of it. Also printed: the gateway's per-request routing cost (rules + selection), timed
in-process. Speed is as measured in this one run (about 3 minutes on 2 cores);
other work on the machine shows up as TTFT, so run it on a quiet one.
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
import timeit
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import ROOT, Arrival, Result, percentile, send, sims_and_gateway, wait_until_up

__all__ = ["ROOT", "Arrival", "Result", "percentile", "send", "wait_until_up"]

BUDGET_MS = 200
STRATEGIES = ("latgate", "round_robin", "least_outstanding")
SLOW_ENDPOINT = "tile-rt-1"
SLOW_OPTIONS = {"ttft_overhead_ms": 500.0, "tpot_ms": 75.0}
SIMS: dict[str, dict[str, Any]] = {
    "tile-rt-0": {"tpot_ms": 25.0, "tpot_growth_ms": 0.1, "ttft_overhead_ms": 3.0, "prefill_tokens_per_second": 50_000.0, "max_batch_size": 8, "prefix_cache": True},
    "tile-rt-1": {"tpot_ms": 25.0, "tpot_growth_ms": 0.1, "ttft_overhead_ms": 3.0, "prefill_tokens_per_second": 50_000.0, "max_batch_size": 8, "prefix_cache": True},
    "vllm-0": {"tpot_ms": 60.0, "tpot_growth_ms": 0.1, "ttft_overhead_ms": 20.0, "prefill_tokens_per_second": 20_000.0, "max_batch_size": 64},
    "vllm-1": {"tpot_ms": 60.0, "tpot_growth_ms": 0.1, "ttft_overhead_ms": 20.0, "prefill_tokens_per_second": 20_000.0, "max_batch_size": 64},
    "hosted-0": {"tpot_ms": 30.0, "tpot_growth_ms": 0.0, "ttft_overhead_ms": 400.0, "prefill_tokens_per_second": 100_000.0, "max_batch_size": 512},
}  # fmt: skip
CONFIG = """
[server]
host = "127.0.0.1"

[defaults]
timeout_sec = 60
connect_timeout_sec = 2
max_retries = 1

[providers.tile-rt]
endpoints = ["{tile-rt-0}/v1", "{tile-rt-1}/v1"]
connector = "vllm"
role = "decode"
models = ["agent-model"]
max_batch_size = 8
enable_prefix_cache = true

[providers.vllm]
endpoints = ["{vllm-0}/v1", "{vllm-1}/v1"]
connector = "vllm"
role = "prefill"
models = ["agent-model"]
max_batch_size = 64

[providers.hosted]
api_base = "{hosted-0}/v1"
role = "upstream"
models = ["agent-model"]

[routing]
strategy = "{strategy}"
default_route = "vllm"
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
long_context_threshold = 16384
long_context_provider = "hosted"
fallbacks = {{ "tile-rt" = ["vllm", "hosted"], "vllm" = ["hosted"] }}

[routing.policies.interactive]
latency_sensitive = true
latency_budget_ms = 200
hedge = true

[health]
probe_interval_sec = 2
load_interval_sec = 0.5
"""

# -- the trace --------------------------------------------------------------------------

WORDS = [
    "the",
    "gateway",
    "routes",
    "each",
    "request",
    "by",
    "prompt",
    "length",
    "and",
    "latency",
    "budget",
    "to",
    "a",
    "decode",
    "pool",
    "a",
    "throughput",
    "pool",
    "or",
    "a",
    "hosted",
    "upstream",
    "while",
    "measuring",
    "time",
    "to",
    "first",
    "token",
    "inter",
    "token",
    "latency",
    "and",
    "tokens",
    "per",
    "second",
    "for",
    "every",
    "stream",
    "it",
    "relays",
    "to",
    "coding",
    "agents",
]


_POOL = random.Random(0).choices(WORDS, k=60_000)


def _text(rng: random.Random, words: int) -> str:
    """``words`` words of filler: a window of a fixed random word sequence."""
    start = rng.randrange(len(_POOL) - words)
    return " ".join(_POOL[start : start + words])


BASE_RATE = 6.0
BURST_RATE = 60.0
BURST_EVERY_S = 8.0
BURST_S = 2.0


def arrival_rate(t: float) -> float:
    """Requests per second at ``t``: 6, with a 2 s burst of 60 every 8 s (from 3 s on)."""
    return BURST_RATE if t >= 3.0 and (t - 3.0) % BURST_EVERY_S < BURST_S else BASE_RATE


def make_trace(*, seed: int, duration_s: float) -> list[Arrival]:
    """The seeded arrival trace (non-homogeneous Poisson by thinning)."""
    rng = random.Random(seed)
    systems = [f"You are coding agent #{n}. " + _text(rng, 300) for n in range(4)]
    general = "You are a helpful assistant. " + _text(rng, 150)
    peak = BURST_RATE
    trace: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration_s:
            return trace
        if rng.random() * peak > arrival_rate(t):
            continue
        draw = rng.random()
        if draw < 0.40:
            kind, system, words, max_tokens = "ls", rng.choice(systems), rng.randint(20, 60), 32
            headers = {"x-latency-budget-ms": str(BUDGET_MS), "x-route-policy": "interactive"}
        elif draw < 0.85:
            kind, system, words, max_tokens = "ordinary", general, rng.randint(750, 1500), 16
            headers = {}
        else:
            kind, system, words, max_tokens = "long", general, rng.randint(17_000, 20_000), 16
            headers = {}
        body = {
            "model": "agent-model",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": _text(rng, words)},
            ],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        trace.append(Arrival(at_s=t, kind=kind, body=orjson.dumps(body), headers=headers))


# -- processes ------------------------------------------------------------------------------


@contextlib.contextmanager
def running_stack(strategy: str):
    """The simulators and a gateway for ``strategy``; yields (gateway URL, sim URLs)."""
    with sims_and_gateway(SIMS, CONFIG.replace("{strategy}", strategy)) as running:
        yield running


# -- the load generator -----------------------------------------------------------------------


async def run_trace(base: str, trace: list[Arrival], *, slow_url: str, slow_at_s: float) -> list[Result]:
    """Send every arrival at its time (open loop); make the slow endpoint slow at ``slow_at_s``."""
    url = base + "/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        started = time.perf_counter()
        tasks = []
        slowed = False
        for arrival in trace:
            if not slowed and arrival.at_s >= slow_at_s:
                async with session.post(slow_url + "/bench/options", data=orjson.dumps(SLOW_OPTIONS)) as response:
                    assert response.status == 200
                slowed = True
            delay = started + arrival.at_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(session, url, arrival)))
        return list(await asyncio.gather(*tasks))


def gateway_counters(base: str) -> dict[str, float]:
    import httpx

    from latgate.live.providers.monitor import parse_gauges

    names = (
        "latgate_overflows_total",
        "latgate_hedges_total",
        "latgate_hedge_wins_total",
        "latgate_ejections_total",
    )
    counters = parse_gauges(httpx.get(base + "/metrics", timeout=5).text, names)
    return {name.removeprefix("latgate_").removesuffix("_total"): counters.get(name, 0.0) for name in names}


# -- summary, table, plot ---------------------------------------------------------------------


def summarize(results: list[Result]) -> dict[str, Any]:
    """The per-strategy numbers of the JSON document (see the module docstring)."""
    ls = [r for r in results if r.kind == "ls"]
    within = sum(1 for r in ls if r.ok and r.ttft_s is not None and r.ttft_s <= BUDGET_MS / 1000.0)
    ls_ttft = [r.ttft_s for r in ls if r.ok and r.ttft_s is not None]
    all_ttft = [r.ttft_s for r in results if r.ok and r.ttft_s is not None]
    tokens = sum(r.completion_tokens for r in results if r.ok)
    span = max(r.done_at for r in results) - min(r.sent_at for r in results) if results else 0.0
    providers: dict[str, int] = {}
    for r in ls:
        providers[r.provider or "none"] = providers.get(r.provider or "none", 0) + 1
    return {
        "slo_attainment": round(within / len(ls), 4) if ls else None,
        "ls_ttft_p50_s": _round(percentile(ls_ttft, 50)),
        "ls_ttft_p99_s": _round(percentile(ls_ttft, 99)),
        "all_ttft_p99_s": _round(percentile(all_ttft, 99)),
        "throughput_tok_s": round(tokens / span, 1) if span else 0.0,
        "errors": sum(1 for r in results if not r.ok),
        "requests": len(results),
        "ls_requests": len(ls),
        "ls_providers": providers,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def table(strategies: dict[str, dict[str, Any]]) -> str:
    columns = (
        "slo_attainment",
        "ls_ttft_p50_s",
        "ls_ttft_p99_s",
        "all_ttft_p99_s",
        "throughput_tok_s",
        "errors",
    )
    lines = [
        "| strategy | " + " | ".join(columns) + " | overflows | hedges (won) | ejections |",
        "|---" * (len(columns) + 4) + "|",
    ]
    for name, row in strategies.items():
        counters = row.get("gateway", {})
        cells = [str(row[c]) for c in columns]
        extra = [
            str(int(counters.get("overflows", 0))),
            f"{int(counters.get('hedges', 0))} ({int(counters.get('hedge_wins', 0))})",
            str(int(counters.get("ejections", 0))),
        ]
        lines.append(f"| {name} | " + " | ".join(cells + extra) + " |")
    return "\n".join(lines)


def write_plot(path: Path, results: dict[str, list[Result]]) -> None:
    """Two panels of TTFT distributions (empirical CDFs, log scale): latency-sensitive
    requests with the budget marked, and all requests."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.6), layout="constrained")
    figure.suptitle("latgate routing_slo: time to first token by strategy (same arrival trace)")
    panels = figure.subplots(1, 2)
    for axes, (title, kinds) in zip(
        panels,
        (("latency-sensitive (200 ms budget)", {"ls"}), ("all requests", {"ls", "ordinary", "long"})),
        strict=True,
    ):
        for name, rows in results.items():
            values = sorted(
                r.ttft_s * 1000.0 for r in rows if r.kind in kinds and r.ok and r.ttft_s is not None
            )
            if values:
                axes.step(
                    values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=name
                )
        if "ls" in kinds and len(kinds) == 1:
            axes.axvline(BUDGET_MS, color="#C44E52", linestyle="--", label="budget")
        axes.set_xscale("log")
        axes.set_xlabel("time to first token (ms)")
        axes.set_ylabel("fraction of requests")
        axes.set_title(title)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(loc="lower right")
    figure.savefig(path, format="png", dpi=100)


# -- the routing cost, in-process ---------------------------------------------------------------


def routing_cost_us() -> dict[str, dict[str, float]]:
    """Microseconds per request, per strategy, of ``Router.decide`` (the rules) and of
    ``Selector.plan`` (live state) for a latency-sensitive chat with a 2 000-character
    system prompt and hedging on (process CPU time, best of 7 runs of 2 000; the rest
    of the gateway's per-request work is in ``benchmarks/overhead.py``)."""
    from latgate.foundation.config import load_config_text
    from latgate.foundation.metrics import Metrics
    from latgate.live.providers import ProviderPool
    from latgate.routing.decision import Router
    from latgate.routing.selection import Selector

    text = CONFIG
    for index, name in enumerate(SIMS):
        text = text.replace("{" + name + "}", f"http://127.0.0.1:{9000 + index}")
    body = orjson.loads(next(a for a in make_trace(seed=1, duration_s=20.0) if a.kind == "ls").body)
    headers = {"x-latency-budget-ms": "200", "x-route-policy": "interactive"}
    out = {}
    for strategy in STRATEGIES:
        config = load_config_text(
            text.replace("{strategy}", strategy).replace("{{", "{").replace("}}", "}"), source="bench"
        )
        pool = ProviderPool(config, metrics=Metrics(providers=config.providers, models=[]), env={})
        router, selector = Router(config), Selector(config=config, pool=pool, rng=random.Random(1))
        decision = router.decide(body, headers)

        def select(selector: Selector = selector, pool: ProviderPool = pool, decision: Any = decision) -> None:
            plan = selector.plan(decision, body)
            pool.release(plan.endpoint)  # as the forwarder does when the attempt starts

        def decide(router: Router = router) -> None:
            router.decide(body, headers)

        n = 2000  # CPU time, not wall time: other processes on the machine do not count
        rules = min(timeit.Timer(decide, timer=time.process_time).repeat(number=n, repeat=7)) / n * 1e6
        selection = min(timeit.Timer(select, timer=time.process_time).repeat(number=n, repeat=7)) / n * 1e6
        out[strategy] = {"decide_us": round(rules, 2), "select_us": round(selection, 2)}
    return out


# -- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT", type=Path, help="write the results as JSON")
    parser.add_argument(
        "--plot",
        metavar="OUT.png",
        type=Path,
        help="write the TTFT plot (default: the --json path with .png)",
    )
    parser.add_argument(
        "--duration", type=float, default=45.0, help="seconds of trace per strategy (default 45)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--strategies", default=",".join(STRATEGIES), help="comma-separated (default: all three)"
    )
    parser.add_argument(
        "--dump", metavar="OUT.jsonl", type=Path, help="write every request's result, one JSON line each"
    )
    parser.add_argument("--no-routing-cost", action="store_true", help="skip timing the routing cost")
    args = parser.parse_args(argv)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        print(
            f"routing_slo: error: unknown strategy {unknown[0]!r}; choose from {', '.join(STRATEGIES)}",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    cost = None if args.no_routing_cost else routing_cost_us()
    if cost is not None:
        print("routing cost per request (us, in-process): " + json.dumps(cost))
    trace = make_trace(seed=args.seed, duration_s=args.duration)
    if args.dump:  # each request asks for X-Latgate-Route-Candidates (dumped with it)
        trace = [dataclasses.replace(a, headers={**a.headers, "x-latgate-debug": "1"}) for a in trace]
    kinds = {k: sum(1 for a in trace if a.kind == k) for k in ("ls", "ordinary", "long")}
    print(
        f"trace: {len(trace)} requests over {args.duration:.0f} s ({kinds}); slow endpoint from {args.duration / 2:.0f} s"
    )
    summaries: dict[str, dict[str, Any]] = {}
    results: dict[str, list[Result]] = {}
    for strategy in strategies:
        with running_stack(strategy) as (base, sims):
            rows = asyncio.run(
                run_trace(base, trace, slow_url=sims[SLOW_ENDPOINT], slow_at_s=args.duration / 2)
            )
            summary = summarize(rows)
            summary["gateway"] = gateway_counters(base)
        summaries[strategy] = summary
        results[strategy] = rows
        print(f"{strategy}: {json.dumps(summary)}", flush=True)
    print()
    print(table(summaries))
    document = {
        "scenario": {
            "duration_s": args.duration,
            "seed": args.seed,
            "budget_ms": BUDGET_MS,
            "requests": len(trace),
            "mix": kinds,
        },
        "routing_cost_us": cost,
        "strategies": summaries,
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.dump:
        with args.dump.open("w") as out:
            for strategy, rows in results.items():
                for row in rows:
                    out.write(json.dumps({"strategy": strategy, **dataclasses.asdict(row)}) + "\n")
    plot = args.plot or (args.json.with_suffix(".png") if args.json else None)
    if plot is not None:
        try:
            write_plot(plot, results)
            print(f"plot: {plot}")
        except ImportError:
            print("plot skipped: it needs matplotlib (pip install 'latgate[plot]')")
    print(f"wall time: {document['wall_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
