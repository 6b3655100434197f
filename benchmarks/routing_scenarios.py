"""Routing scenarios: cold start, identical replicas, recovery, a full decode pool, and
unequal capacity under overload, each under latgate's strategies and the peers.

    .venv/bin/python benchmarks/routing_slo.py --scenarios all [--json OUT.json]
    .venv/bin/python benchmarks/routing_slo.py --scenarios identical,recovery --systems latgate,vllm-router

Every scenario starts fresh simulators (``latgate.sim``, one event loop in a child
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
from the simulators (arrival times), the same for every system.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from peers import PEERS, wait_port
from routing_report import LATGATE_SYSTEMS, gateway_numbers, summarize, table
from routing_slo import ROOT, Arrival, Result, send, wait_until_up
from serving import free_port, latgate_serve_command, serve_apps

PEER_SYSTEMS = ("litellm", "vllm-router")
MODEL = "m"
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


# -- simulators with a control surface ------------------------------------------------------


def serve_controlled_sims(spec: dict[str, Any]) -> None:
    """Child process: each simulator of ``spec`` (name -> [port, fields]) on one loop, with
    ``GET /bench/arrivals`` (monotonic times of its chat requests) and ``POST
    /bench/options`` (JSON fields to set on its engine); ``slow_first`` delays its
    first N chat requests by the given ms before they reach the engine."""
    from latgate.sim import SimOptions, create_sim_app

    def controlled(app: Any, slow_first: tuple[int, float] | None) -> Any:
        arrivals: list[float] = []

        async def wrapped(scope: dict, receive: Any, send_: Any) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and path.startswith("/bench/"):
                if path == "/bench/arrivals":
                    body = orjson.dumps(arrivals)
                else:
                    chunks = []
                    while True:
                        message = await receive()
                        chunks.append(message.get("body", b""))
                        if not message.get("more_body"):
                            break
                    fields = orjson.loads(b"".join(chunks))
                    app.engine.options = dataclasses.replace(app.engine.options, **fields)
                    body = b"{}"
                await send_({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
                await send_({"type": "http.response.body", "body": body})
                return
            if scope["type"] == "http" and path.endswith("/chat/completions"):
                arrivals.append(time.monotonic())
                if slow_first is not None and len(arrivals) <= slow_first[0]:
                    await asyncio.sleep(slow_first[1] / 1000.0)
            await app(scope, receive, send_)

        return wrapped

    apps = {}
    for name, (port, fields) in spec.items():
        fields = dict(fields)
        slow_first = fields.pop("slow_first", None)
        fields.pop("slow_window", None)
        apps[port] = controlled(create_sim_app(SimOptions(name=name, seed=1, **fields)), slow_first)
    serve_apps(apps)


@contextlib.contextmanager
def running(scenario: Scenario, system: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The scenario's simulators and ``system`` in front of them; yields (router URL,
    simulator URLs by name)."""
    spec = {name: (free_port(), fields) for name, fields in scenario.sims.items()}
    urls = {name: f"http://127.0.0.1:{port}" for name, (port, _) in spec.items()}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    sims = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "routing_slo.py"), "--serve-scenario-sims", json.dumps(spec)], env=env
    )
    router = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for url in urls.values():
                wait_until_up(url + "/health")
            port = free_port()
            quiet = subprocess.DEVNULL if system in PEER_SYSTEMS else None  # the peers log every request
            router = subprocess.Popen(
                _command(scenario, system, urls, port, Path(tmp)), env=_env(system, env), stdout=quiet, stderr=quiet
            )
            if system in LATGATE_SYSTEMS:
                wait_until_up(f"http://127.0.0.1:{port}/readyz")
            else:
                wait_port(port, timeout=120.0, proc=router)
                _wait_routes(f"http://127.0.0.1:{port}")
            yield f"http://127.0.0.1:{port}", urls
        finally:
            for process in (router, sims):
                if process is not None:
                    process.kill()
                    process.wait()


def _command(scenario: Scenario, system: str, urls: dict[str, str], port: int, tmp: Path) -> list[str]:
    if system in LATGATE_SYSTEMS:
        text = scenario.config
        for name, url in urls.items():
            text = text.replace("{" + name + "}", url)
        config = tmp / "config.toml"
        config.write_text(text.replace("{strategy}", system).replace("{{", "{").replace("}}", "}"))
        return latgate_serve_command(config, port=port, log_level="warning")
    if system == "vllm-router":
        return [str(PEERS / "vllm-router" / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--policy", "power_of_two", "--worker-urls", *urls.values()]  # fmt: skip
    entries = "".join(
        f"  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
        f"      api_base: {url}/v1\n      api_key: sk-bench\n"
        for url in urls.values()
    )
    (tmp / "litellm.yaml").write_text(
        "model_list:\n" + entries + "router_settings:\n  routing_strategy: latency-based-routing\n"
        "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
        "general_settings:\n  disable_spend_logs: true\n"
    )
    return [str(PEERS / "litellm" / "bin" / "litellm"), "--config", str(tmp / "litellm.yaml"),
            "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]  # fmt: skip


def _env(system: str, env: dict[str, str]) -> dict[str, str]:
    if system != "litellm":
        return env
    return {
        **env,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }


def _wait_routes(base: str, *, seconds: float = 60.0) -> None:
    """Poll a peer until a small chat request succeeds (its workers are registered)."""
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "warm"}], "max_tokens": 1}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(base + "/v1/chat/completions", json=body, timeout=5.0).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{base} routes no request after {seconds:.0f} s")


def peer_missing(system: str) -> str | None:
    """Why a peer cannot run here, or None."""
    binary = PEERS / system / "bin" / system
    return None if binary.exists() else "not installed (benchmarks/setup_peers.sh)"


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


async def closed_loop(session: aiohttp.ClientSession, url: str, arrivals: list[Arrival], concurrency: int) -> list[Result]:
    """Send ``arrivals`` in order, ``concurrency`` at a time."""
    queue = list(reversed(arrivals))
    results: list[Result] = []

    async def worker() -> None:
        while queue:
            results.append(await send(session, url, queue.pop()))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def open_loop(session: aiohttp.ClientSession, url: str, arrivals: list[Arrival], controls: list[tuple[float, Callable]]) -> list[Result]:
    """Send each arrival at its time; run each control coroutine factory at its time."""
    started = time.perf_counter()
    events = sorted([(a.at_s, 1, a) for a in arrivals] + [(at, 0, c) for at, c in controls], key=lambda e: (e[0], e[1]))
    tasks = []
    for at_s, kind, item in events:
        delay = started + at_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if kind == 0:
            await item()
        else:
            tasks.append(asyncio.create_task(send(session, url, item)))
    return list(await asyncio.gather(*tasks))


async def _set_options(session: aiohttp.ClientSession, url: str, fields: dict[str, Any]) -> None:
    async with session.post(url + "/bench/options", data=orjson.dumps(fields)) as response:
        assert response.status == 200


async def _arrivals(session: aiohttp.ClientSession, urls: dict[str, str]) -> dict[str, list[float]]:
    out = {}
    for name, url in urls.items():
        async with session.get(url + "/bench/arrivals") as response:
            out[name] = orjson.loads(await response.read())
    return out


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
            arrivals = []
            t = 0.0
            while t < 15.0:
                t += rng.expovariate(10.0)
                arrivals.append(_arrival(rng, "ls" if rng.random() < 0.6 else "ordinary", at_s=t, max_tokens=32))
            results += await open_loop(session, url, arrivals, [])
        elif name == "unequal":
            arrivals = []
            t = 0.0
            while t < 40.0:
                t += rng.expovariate(40.0)
                rate = 40.0 if t >= 3.0 and (t - 3.0) % 8.0 < 2.0 else 14.0
                if rng.random() * 40.0 > rate:
                    continue
                kind = "ls" if rng.random() < 0.4 else "ordinary"
                arrivals.append(_arrival(rng, kind, at_s=t, budget_ms=scenario.budget_ms, max_tokens=32))
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
            t = 0.0
            while t < 15.0:
                t += rng.expovariate(6.0)
                kind = rng.choice(("ls", "ls", "ls", "ls", "ordinary", "steady"))
                arrival = _arrival(rng, "ordinary" if kind == "steady" else kind, at_s=t, max_tokens=64)
                arrivals.append(dataclasses.replace(arrival, headers=steady) if kind == "steady" else arrival)
            results += await open_loop(session, url, arrivals, [])
        after = await _arrivals(session, sims)
    seen = {n: after[n][len(before[n]) :] for n in after}
    return {"results": results, "arrivals": seen, "marks": marks}


__all__ = ["LATGATE_SYSTEMS", "PEER_SYSTEMS", "SCENARIOS", "run", "serve_controlled_sims", "table"]


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
