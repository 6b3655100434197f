"""Soak run: minutes of mixed traffic with injected faults, on loopback, watching the
gateway's memory.

    .venv/bin/python benchmarks/soak.py [--duration-seconds 180] [--concurrency 16]
        [--sample-seconds 5] [--redis-url redis://127.0.0.1:6379/0] [--json OUT]

Set-up: two engine simulators (``latgate sim``) that fail on purpose (500s, 429s,
stalls longer than the gateway's read timeout, connections dropped mid-reply), each the
other's fallback; the gateway (``latgate serve``, access log off) with two gateway keys,
one limited to 120 requests per minute; optionally Redis-shared state. Each client
worker loops over a seeded mix: streamed chats read to the end, whole answers, streams
abandoned after the first content chunk, latency-sensitive requests, malformed JSON,
wrong types, an unknown key, the limited key. Every ``--sample-seconds`` the gateway's
resident memory (``VmRSS`` from ``/proc/PID/status``) and in-flight gauge are recorded.

Verdict: memory is *flat* when the peak of the last fifth of the run is within
``--max-growth-mb`` of the peak between 20% and 40% of it (allocator warm-up and
connection pools fill the first fifth). The run fails (exit 1) on growth beyond that,
on any ``internal_error`` (a gateway bug; counted apart from an upstream's own 500s,
which reach the client when every attempt failed), or when requests are still counted
in flight after the load stops. Loopback only; nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import free_port, latgate_serve_command

MESSAGES = [{"role": "user", "content": "summarise the design of a latency-aware gateway in two lines"}]
GOOD_KEY, LIMITED_KEY = "sk-soak", "sk-soak-limited"
CONFIG = """
[defaults]
timeout_sec = 0.25
connect_timeout_sec = 1
first_token_timeout_sec = 0.3
max_retries = 1

[providers.a]
api_base = "http://127.0.0.1:{a}/v1"

[providers.b]
api_base = "http://127.0.0.1:{b}/v1"

[routing]
default_route = "a"
route_latency_sensitive_to = "b"
fallbacks = {{ a = ["b"], b = ["a"] }}

[[auth.keys]]
name = "soak"
key = "{good}"

[[auth.keys]]
name = "limited"
key = "{limited}"
rpm = 120
tpm = 200000
{state}"""
SIM_FAULTS = [
    "--error-rate", "0.03", "--rate-limit-rate", "0.03", "--retry-after-seconds", "0",
    "--stall-rate", "0.03", "--stall-ms", "400", "--drop-rate", "0.03",
    "--tpot-ms", "1", "--ttft-overhead-ms", "2", "--default-max-tokens", "24", "--max-output-tokens", "48",
]  # fmt: skip


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def in_flight(metrics_text: str) -> float:
    """Sum of ``latgate_in_flight_requests`` over providers."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text.splitlines()
        if line.startswith("latgate_in_flight_requests{")
    )


def wait_ready(url: str, proc: subprocess.Popen, timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"soak: {url} exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"soak: {url} not ready after {timeout_seconds} s")


async def one_request(client: httpx.AsyncClient, rng: random.Random, outcomes: Counter[str]) -> None:
    """One request of the mix; its outcome (status, or ``abandoned``/``transport``) is counted."""
    roll = rng.random()
    headers = {"authorization": f"Bearer {GOOD_KEY}"}
    body: dict | None = {"model": "soak", "messages": MESSAGES, "stream": True}
    content: bytes | None = None
    abandon = False
    if roll < 0.40:
        pass  # streamed, read to the end
    elif roll < 0.60:
        body["stream"] = False
    elif roll < 0.70:
        abandon = True
    elif roll < 0.78:
        headers["x-latency-sensitive"] = "1"
    elif roll < 0.82:
        body, content = None, b'{"model": "soak", "messages": ['
    elif roll < 0.86:
        body = {"model": 5, "messages": "not a list"}
    elif roll < 0.90:
        headers["authorization"] = "Bearer sk-wrong"
    else:
        headers["authorization"] = f"Bearer {LIMITED_KEY}"
    kwargs = (
        {"json": body}
        if body is not None
        else {"content": content, "headers": {**headers, "content-type": "application/json"}}
    )
    kwargs.setdefault("headers", headers)
    try:
        async with client.stream("POST", "/v1/chat/completions", **kwargs) as response:
            if abandon and response.status_code == 200:
                async for line in response.aiter_lines():
                    if '"content":"' in line and '"content":""' not in line:
                        break
                outcomes["abandoned"] += 1
                return
            data = await response.aread()
            internal = response.status_code == 500 and b'internal error in latgate' in data
            outcomes["internal_error" if internal else str(response.status_code)] += 1
    except httpx.TransportError:
        outcomes["transport"] += 1


async def load(base_url: str, *, concurrency: int, stop_at: float, seed: int, outcomes: Counter[str]) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=10, limits=limits) as client:

        async def worker(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            while time.monotonic() < stop_at:
                await one_request(client, rng, outcomes)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))


async def sample(gateway_pid: int, base_url: str, *, every_seconds: float, stop_at: float, started: float,
                 outcomes: Counter[str], samples: list[dict]) -> None:  # fmt: skip
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as client:
        while True:
            metrics = (await client.get("/metrics")).text
            row = {
                "t_s": round(time.monotonic() - started, 1),
                "rss_mb": round(rss_mb(gateway_pid), 1),
                "requests": sum(outcomes.values()),
                "in_flight": in_flight(metrics),
            }
            samples.append(row)
            print(
                f"  t={row['t_s']:7.1f}s  rss={row['rss_mb']:7.1f} MiB  requests={row['requests']:8d}  in_flight={row['in_flight']:.0f}",
                flush=True,
            )
            if time.monotonic() >= stop_at:
                return
            await asyncio.sleep(min(every_seconds, max(0.0, stop_at - time.monotonic())))


def verdict(samples: list[dict], *, max_growth_mb: float) -> dict:
    """Growth of peak RSS from the 20-40% window to the last fifth of the run."""
    rss = [s["rss_mb"] for s in samples]
    n = len(rss)
    early = rss[int(n * 0.2) : max(int(n * 0.4), int(n * 0.2) + 1)]
    late = rss[max(0, n - max(1, n // 5)) :]
    growth = max(late) - max(early)
    return {
        "baseline_mb": max(early),
        "end_mb": max(late),
        "growth_mb": round(growth, 1),
        "flat": growth <= max_growth_mb,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-seconds", type=float, default=180.0, help="load duration (default 180)")
    parser.add_argument("--concurrency", type=int, default=16, help="client workers (default 16)")
    parser.add_argument("--sample-seconds", type=float, default=5.0, help="RSS sampling period (default 5)")
    parser.add_argument(
        "--max-growth-mb", type=float, default=10.0, help="allowed RSS growth (default 10 MiB)"
    )
    parser.add_argument(
        "--redis-url", help="share limits and health through this Redis (default: in-process)"
    )
    parser.add_argument("--seed", type=int, default=1, help="request mix and fault seed (default 1)")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--gateway-log", help="write the gateway's log here (default: discarded)")
    args = parser.parse_args(argv)
    if args.duration_seconds <= 0 or args.concurrency < 1 or args.sample_seconds <= 0:
        parser.error("--duration-seconds and --sample-seconds must be > 0, --concurrency >= 1")

    ports = {"a": free_port(), "b": free_port(), "gateway": free_port()}
    state = f'\n[state]\nredis_url = "{args.redis_url}"\n' if args.redis_url else ""
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "soak.toml"
        config.write_text(
            CONFIG.format(a=ports["a"], b=ports["b"], good=GOOD_KEY, limited=LIMITED_KEY, state=state)
        )
        try:
            for name in ("a", "b"):
                seed = str(args.seed + (name == "b"))
                cmd = [
                    sys.executable,
                    "-m",
                    "latgate",
                    "sim",
                    "--port",
                    str(ports[name]),
                    "--name",
                    name,
                    "--seed",
                    seed,
                    *SIM_FAULTS,
                ]
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            log = open(args.gateway_log, "w") if args.gateway_log else subprocess.DEVNULL  # noqa: SIM115
            gateway = subprocess.Popen(
                latgate_serve_command(config, port=ports["gateway"], log_level="warning"),
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            procs.append(gateway)
            for name in ("a", "b"):
                wait_ready(f"http://127.0.0.1:{ports[name]}/health", procs[0 if name == "a" else 1])
            base_url = f"http://127.0.0.1:{ports['gateway']}"
            wait_ready(base_url + "/healthz", gateway)
            print(
                f"soak: {args.duration_seconds:.0f} s, {args.concurrency} workers, faults {' '.join(SIM_FAULTS[:10])}",
                flush=True,
            )
            outcomes: Counter[str] = Counter()
            samples: list[dict] = []
            started = time.monotonic()
            stop_at = started + args.duration_seconds

            async def run() -> None:
                await asyncio.gather(
                    load(
                        base_url,
                        concurrency=args.concurrency,
                        stop_at=stop_at,
                        seed=args.seed,
                        outcomes=outcomes,
                    ),
                    sample(
                        gateway.pid,
                        base_url,
                        every_seconds=args.sample_seconds,
                        stop_at=stop_at,
                        started=started,
                        outcomes=outcomes,
                        samples=samples,
                    ),
                )

            asyncio.run(run())
            final_in_flight = in_flight(httpx.get(base_url + "/metrics", timeout=5).text)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    memory = verdict(samples, max_growth_mb=args.max_growth_mb)
    total = sum(outcomes.values())
    report = {
        "duration_seconds": args.duration_seconds,
        "concurrency": args.concurrency,
        "requests": total,
        "requests_per_second": round(total / args.duration_seconds, 1),
        "outcomes": dict(sorted(outcomes.items())),
        "in_flight_after": final_in_flight,
        "samples": samples,
        "memory": memory,
    }
    ok = memory["flat"] and outcomes.get("internal_error", 0) == 0 and final_in_flight == 0
    report["ok"] = ok
    print(f"soak: {total} requests ({report['requests_per_second']}/s) outcomes {report['outcomes']}")
    print(
        f"soak: RSS {memory['baseline_mb']} -> {memory['end_mb']} MiB (growth {memory['growth_mb']} MiB, "
        f"{'flat' if memory['flat'] else 'GROWING'}); in flight after: {final_in_flight:.0f}; {'ok' if ok else 'FAILED'}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
