"""Gateway overhead on loopback: latgate, nginx, vllm-router and LiteLLM proxy versus the
upstream called directly, in one run.

    .venv/bin/python benchmarks/overhead.py [--quick] [--json OUT] [--workers 2]
    bash benchmarks/setup_peers.sh    # once, for the peers (each is skipped when absent)

Set-up (2 cores): each gateway runs alone on core 0 (``taskset``; one worker, or one
nginx worker), one at a time; the zero-delay mock upstream (``mock_upstream.py``) and
the load generator (``loadgen.py``) share core 1. latgate runs with its shipped
defaults: routing, metrics, access log at INFO (to a file nobody reads, like nginx's
access log here: off).

Modes: ``non-stream`` (one chat completion object), ``stream-64`` (64 content chunks
written back to back, each its own write), ``paced`` (32 chunks 20 ms apart, at high
concurrency: what a busy gateway in front of real engines sees); ``agent``,
``agent-stream`` and ``agent-messages`` send the ~100 KB agent bodies of
``agent_bodies.py`` (chat completions, streamed or not, and ``/v1/messages``). Each cell
runs for a fixed time with ``c`` connections sending one request after another.

Suites (``--suites``, all by default): ``overhead`` (the two-word modes, every target),
``agent`` (the agent modes, every target), ``state`` (latgate with ``[auth]`` and RPM/TPM
limits, in process and with ``[state] redis_url`` on a local ``redis-server``) and
``providers`` (latgate with 1, 10 and 100 providers of 4 endpoints, one per mock port,
active probes off).

Per target, mode and concurrency it records ``rps``, ``p50_ms``, ``p99_ms``,
``ttfc_p50_ms`` (time to first body byte), ``itl_p99_ms`` (gaps between reads, paced
only), ``cpu_us_per_request`` (the gateway's user+system CPU from ``/proc`` over the
cell, per request), ``cpu_us_per_chunk`` (streams: the CPU beyond a non-streamed
request's at the same concurrency, per chunk), ``rss_mb``, and the ``added_*`` figures
versus direct. ``--json OUT`` writes them all, with the issue's targets checked.
Speed is reported as measured in this one run; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_bodies import chat_body, messages_body
from harness import percentile, write_json
from loadgen import request_bytes, run_load
from mock_upstream import CHUNKS, PACED_CHUNKS
from peers import Direct, Latgate, LiteLLM, Nginx, Redis, Target, VllmRouter, cpu_seconds, rss_mb, wait_port
from peers import free_port as _free_port

#: mode -> (model, stream, body kind, path): ``tiny`` is a two-word chat, ``agent`` and
#: ``messages`` the ~100 KB agent bodies of :mod:`agent_bodies`.
MODES = {
    "non-stream": ("bench", False, "tiny", "/v1/chat/completions"),
    "stream-64": ("bench", True, "tiny", "/v1/chat/completions"),
    "paced": ("bench-paced", True, "tiny", "/v1/chat/completions"),
    "agent": ("bench", False, "agent", "/v1/chat/completions"),
    "agent-stream": ("bench", True, "agent", "/v1/chat/completions"),
    "agent-messages": ("bench", False, "messages", "/v1/messages"),
}
STREAMED_PER_CHUNK = {"stream-64": CHUNKS, "paced": PACED_CHUNKS}
SUITES = ("overhead", "agent", "state", "providers")
PROVIDER_COUNTS = (1, 10, 100)
ENDPOINTS_PER_PROVIDER = 4


def plan(*, quick: bool, suite: str = "overhead") -> list[tuple[str, int, float]]:
    """(mode, concurrency, seconds) cells of one suite, in order."""
    t = 1.2 if quick else 4.0
    if suite == "agent":
        return [(mode, c, t) for mode in ("agent", "agent-messages") for c in (1, 16)] + [("agent-stream", 16, t)]
    if suite in ("state", "providers"):
        return [("non-stream", c, t) for c in (1, 16)] + [("agent", 1, t)]
    cells = [(mode, c, t) for mode in ("non-stream", "stream-64") for c in (1, 16, 64)]
    cells += [("paced", 1000, 2.0 if quick else 4.0)]
    if not quick:
        cells.insert(-1, ("paced", 300, 3.0))
    return cells


def body(model: str, stream: bool, kind: str = "tiny") -> bytes:
    if kind == "agent":
        return chat_body(model, stream=stream)
    if kind == "messages":
        return messages_body(model, stream=stream)
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream},
        separators=(",", ":"),
    ).encode()


def measure(target: Target, mode: str, c: int, seconds: float) -> dict:
    model, stream, kind, path = MODES[mode]
    request = request_bytes(port=target.port, path=path, body=body(model, stream, kind))
    paced = mode == "paced"
    warm = 0.8 if paced else target.warm_seconds
    uvloop.run(run_load(port=target.port, request=request, concurrency=c, seconds=warm))
    pids = target.pids()
    cpu0 = cpu_seconds(pids)
    res = uvloop.run(run_load(port=target.port, request=request, concurrency=c, seconds=seconds, gaps=paced))
    cpu = cpu_seconds(pids) - cpu0
    n = len(res.latency_ms)
    row = {
        "target": target.name,
        "mode": mode,
        "concurrency": c,
        "requests": n,
        "errors": res.errors,
        "rps": n / res.seconds if res.seconds else 0.0,
        "p50_ms": percentile(res.latency_ms, 50, empty=math.nan),
        "p99_ms": percentile(res.latency_ms, 99, empty=math.nan),
        "ttfc_p50_ms": percentile(res.ttfc_ms, 50, empty=math.nan),
        "cpu_us_per_request": cpu / n * 1e6 if n and pids else None,
        "rss_mb": rss_mb(pids) if pids else None,
    }
    if paced:
        row["itl_p50_ms"] = percentile(res.gaps_ms, 50, empty=math.nan)
        row["itl_p99_ms"] = percentile(res.gaps_ms, 99, empty=math.nan)
    return row


def derive(rows: list[dict]) -> None:
    """Per-chunk CPU and the figures added versus direct, in place."""
    index = {(r["target"], r["mode"], r["concurrency"]): r for r in rows}
    for r in rows:
        base = index.get((r["target"], "non-stream", r["concurrency"] if r["mode"] == "stream-64" else 64))
        if (
            r["mode"] in STREAMED_PER_CHUNK
            and base
            and r["cpu_us_per_request"] is not None
            and base["cpu_us_per_request"] is not None
        ):
            per = STREAMED_PER_CHUNK[r["mode"]]
            r["cpu_us_per_chunk"] = (r["cpu_us_per_request"] - base["cpu_us_per_request"]) / per
        direct = index.get(("direct", r["mode"], r["concurrency"]))
        if direct and r["target"] != "direct":
            for key in ("p50_ms", "p99_ms", "ttfc_p50_ms", "itl_p99_ms"):
                if key in r:
                    r["added_" + key] = r[key] - direct[key]


def check_targets(rows: list[dict], idle: dict[str, float]) -> list[dict]:
    """The issue's targets for latgate, each with the measured value and whether it is met."""
    at = {(r["target"], r["mode"], r["concurrency"]): r for r in rows}
    lat = lambda mode, c: at.get(("latgate", mode, c), {})
    out = []

    def add(name: str, value: float | None, limit: float, *, at_least: bool = False) -> None:
        met = None if value is None else (value >= limit if at_least else value <= limit)
        out.append({"target": name, "value": value, "limit": limit, "met": met})

    add("added p50 ms, c=1", lat("non-stream", 1).get("added_p50_ms"), 0.5)
    add("added p99 ms, c=1", lat("non-stream", 1).get("added_p99_ms"), 1.5)
    add("cpu us/request (c=64)", lat("non-stream", 64).get("cpu_us_per_request"), 250)
    cpu = lat("non-stream", 64).get("cpu_us_per_request")
    add("requests/s per core (1e6/cpu us)", 1e6 / cpu if cpu else None, 4000, at_least=True)
    add("cpu us/chunk (stream-64, c=64)", lat("stream-64", 64).get("cpu_us_per_chunk"), 10)
    add("added ttfc p50 ms, c=1", lat("stream-64", 1).get("added_ttfc_p50_ms"), 0.6)
    add("idle rss MB", idle.get("latgate"), 100)
    loaded = [r["rss_mb"] for r in rows if r["target"] == "latgate" and r["rss_mb"]]
    add(
        "rss growth under load MB",
        max(loaded) - idle["latgate"] if loaded and "latgate" in idle else None,
        50,
    )
    lite = at.get(("litellm", "non-stream", 64), {})
    if lite.get("cpu_us_per_request") and cpu:
        add("x LiteLLM requests/s per core", lite["cpu_us_per_request"] / cpu, 40, at_least=True)
        add("x LiteLLM rps (c=64)", lat("non-stream", 64).get("rps", 0) / lite["rps"], 40, at_least=True)
    add("added itl p99 ms, paced c=1000", lat("paced", 1000).get("added_itl_p99_ms"), 5)
    router = lambda mode, c: at.get(("vllm-router", mode, c), {}).get("cpu_us_per_request")
    ratio = lambda a, b: a / b if a is not None and b else None
    for c in (1, 16):
        add(f"agent cpu/request x vllm-router (c={c})", ratio(lat("agent", c).get("cpu_us_per_request"), router("agent", c)), 0.6)
    add("agent added p50 ms, c=1", lat("agent", 1).get("added_p50_ms"), 0.5)
    for c in (16, 64):
        add(f"tiny cpu/request x vllm-router (c={c})", ratio(lat("non-stream", c).get("cpu_us_per_request"), router("non-stream", c)), 1.5)
    memory = lambda c: at.get(("latgate-limits", "non-stream", c), {})
    redis = lambda c: at.get(("latgate-limits-redis", "non-stream", c), {})
    if redis(1) and memory(1):
        add("redis limits: added p50 ms over in-process (c=1)", redis(1)["p50_ms"] - memory(1)["p50_ms"], 0.3)
    for c in (1, 16):
        add(f"redis limits: cpu/request x in-process (c={c})", ratio(redis(c).get("cpu_us_per_request"), memory(c).get("cpu_us_per_request")), 1.3)
    many = lambda n, c: at.get((f"latgate-p{n}", "non-stream", c), {}).get("cpu_us_per_request")
    for c in (1, 16):
        add(f"100 providers: cpu/request x 1 provider (c={c})", ratio(many(100, c), many(1, c)), 2.0)
    for mode in ("non-stream", "stream-64"):
        two = at.get(("latgate-w2", mode, 64))
        if two and lat(mode, 64).get("rps"):
            add(
                f"--workers 2 / 1 worker rps ({mode}, c=64)",
                two["rps"] / lat(mode, 64)["rps"],
                1.7,
                at_least=True,
            )
    return out


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def print_table(rows: list[dict], idle: dict[str, float], checks: list[dict]) -> None:
    print("idle RSS MB: " + ", ".join(f"{k} {v:.0f}" for k, v in idle.items()))
    head = f"{'target':<12}{'mode':<11}{'c':>5}{'rps':>8}{'p50 ms':>8}{'p99 ms':>8}{'+p50':>7}{'+p99':>7}{'+ttfc':>7}{'+itl99':>7}{'us/req':>8}{'us/chunk':>9}{'rss MB':>7}{'err':>5}"
    print(head)
    for r in rows:
        print(
            f"{r['target']:<12}{r['mode']:<11}{r['concurrency']:>5}{fmt(r['rps'], '.0f'):>8}{fmt(r['p50_ms'], '.2f'):>8}"
            f"{fmt(r['p99_ms'], '.2f'):>8}{fmt(r.get('added_p50_ms'), '.2f'):>7}{fmt(r.get('added_p99_ms'), '.2f'):>7}"
            f"{fmt(r.get('added_ttfc_p50_ms'), '.2f'):>7}{fmt(r.get('added_itl_p99_ms'), '.2f'):>7}"
            f"{fmt(r['cpu_us_per_request'], '.0f'):>8}{fmt(r.get('cpu_us_per_chunk'), '.1f'):>9}{fmt(r['rss_mb'], '.0f'):>7}{r['errors']:>5}"
        )
    print("latgate targets:")
    for t in checks:
        verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "MISSED")
        print(f"  {t['target']:<42}{fmt(t['value'], '.2f'):>10}  limit {t['limit']:<7} {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="shorter cells (under 2 minutes with every peer)"
    )
    parser.add_argument("--json", metavar="OUT", help="write every figure to this file")
    parser.add_argument(
        "--workers", type=int, default=1, help="also run latgate --workers N on both cores (N > 1)"
    )
    parser.add_argument(
        "--targets",
        default="latgate,nginx,vllm-router,litellm",
        help="comma-separated subset of latgate,nginx,vllm-router,litellm (direct always runs)",
    )
    parser.add_argument(
        "--suites",
        default=",".join(SUITES),
        help="comma-separated subset of overhead (two-word bodies, streams), agent (~100 KB agent bodies), "
        "state (auth and RPM/TPM limits, in process and in Redis), providers (1, 10, 100 providers of 4 endpoints)",
    )
    args = parser.parse_args()
    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        print("overhead.py needs Linux and 2 cores", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {1})
    wanted = [t.strip() for t in args.targets.split(",") if t.strip()]
    suites = [t.strip() for t in args.suites.split(",") if t.strip()]
    known = {
        "latgate": Latgate,
        "nginx": Nginx,
        "vllm-router": VllmRouter,
        "litellm": LiteLLM,
    }
    unknown = [t for t in wanted if t not in known] + [s for s in suites if s not in SUITES]
    if unknown:
        print(f"unknown target(s) or suite(s): {', '.join(unknown)}; known: {', '.join([*known, *SUITES])}", file=sys.stderr)
        return 2
    redis = Redis()
    redis_url = None
    if "state" in suites and redis.available() is None:
        redis_url = redis.start()
    # each target with the union of its suites' cells, in plan order
    runs: dict[str, tuple[Target, list[tuple[str, int, float]]]] = {}

    def add(target: Target, suite: str) -> None:
        _, cells = runs.setdefault(target.name, (target, []))
        cells.extend(cell for cell in plan(quick=args.quick, suite=suite) if cell not in cells)

    for suite in suites:
        if suite in ("overhead", "agent"):
            for name in wanted:
                add(runs[name][0] if name in runs else known[name](), suite)
            if suite == "overhead" and args.workers > 1:
                add(Latgate(cores="0,1", workers=args.workers), suite)
        elif suite == "state":
            add(Latgate(name="latgate-limits", limits=True), suite)
            if redis_url:
                add(Latgate(name="latgate-limits-redis", limits=True, redis_url=redis_url), suite)
        elif suite == "providers":
            for n in PROVIDER_COUNTS:
                add(Latgate(name=f"latgate-p{n}", providers=n), suite)
    up_ports = [_free_port() for _ in range(ENDPOINTS_PER_PROVIDER)]
    up_port = up_ports[0]
    for target, _ in runs.values():
        if isinstance(target, Latgate):
            target.upstream_ports = up_ports
    mock = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, str(Path(__file__).with_name("mock_upstream.py")), *map(str, up_ports)]
    )
    rows: list[dict] = []
    idle: dict[str, float] = {}
    skipped: dict[str, str] = {}
    if "state" in suites and redis_url is None:
        skipped["latgate-limits-redis"] = redis.available() or "redis-server did not start"
    started = time.monotonic()
    try:
        for port in up_ports:
            wait_port(port, timeout=10, proc=mock)
        direct = Direct()
        direct.port = up_port
        direct_cells: list[tuple[str, int, float]] = []
        for _, cells in runs.values():
            direct_cells.extend(cell for cell in cells if cell not in direct_cells)
        for mode, c, seconds in direct_cells:
            rows.append(measure(direct, mode, c, seconds))
        for target, cells in runs.values():
            why = target.available()
            if why:
                skipped[target.name] = why
                print(f"skipping {target.name}: {why}", file=sys.stderr)
                continue
            try:
                target.start(upstream_port=up_port)
            except RuntimeError as exc:
                skipped[target.name] = str(exc)
                print(f"skipping {target.name}: {exc}", file=sys.stderr)
                continue
            try:
                idle[target.name] = rss_mb(target.pids())
                for mode, c, seconds in cells:
                    if target.name.startswith("latgate-w") and c != 64:
                        continue  # the workers comparison is about throughput
                    if args.quick and target.name == "litellm" and mode == "paced":
                        continue  # minutes at ~1 ms per chunk; the full run has it
                    rows.append(measure(target, mode, c, seconds))
                    print(f"  {target.name} {mode} c={c}: {rows[-1]['rps']:.0f} rps", file=sys.stderr)
            finally:
                target.stop()
    finally:
        mock.terminate()
        mock.wait(timeout=10)
        redis.stop()
    derive(rows)
    checks = check_targets(rows, idle)
    print(
        f"{platform.node()} load average {os.getloadavg()[0]:.2f}; {time.monotonic() - started:.0f} s"
    )
    print_table(rows, idle, checks)
    if args.json:
        out = {
            "command": " ".join(sys.argv),
            "load_average": os.getloadavg(),
            "idle_rss_mb": idle,
            "skipped": skipped,
            "rows": rows,
            "targets": checks,
        }
        write_json(Path(args.json), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
