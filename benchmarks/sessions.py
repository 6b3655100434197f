"""Coding-agent sessions: where each turn lands decides what it costs (issue 21).

    .venv/bin/python benchmarks/sessions.py [--quick] [--json OUT.json] [--markdown OUT.md]
        [--sessions 16] [--turns 30] [--think-seconds 0.4] [--cache-tokens 400000]
        [--systems a,b,...] [--replicas equal,unequal,slowed] [--headers on,off] [--seed 21]
        [--slow-at-seconds 8]

The issue's shape: 16 sessions share one ~8k-token system prompt; each of 30 turns
(480 requests) resends the session's whole history plus ~1.6k new tokens (a short
assistant message and a tool output), then waits a think time (exponential, mean
``--think-seconds``, 0.4 s: an agent's tool runs scaled down so that every system and
case fits in ~20 minutes on a loaded 2-core machine) after its reply. The sessions
start spread over the first two seconds. Four simulated replicas of one model
(``latgate.commands.sim``, one event loop in a child process) each keep a block-level prefix
cache (16-token blocks, LRU, 400k tokens: 1.8x what four sessions' 56k-token final
histories need, so the oracle's placement fits and every session everywhere does not)
and prefill one request at a time (20k tokens/s: a full 56k-token history costs 2.8 s,
a turn's new tokens 80 ms); ``unequal`` makes the fourth replica slower (10k tokens/s,
twice the time per token). Session headers ``on``: every turn carries the session id in
``x-claude-code-session-id`` as Claude Code sends it and in ``X-Session-ID``, the
generic header (latgate's last choice, vllm-router's first key); ``off``: nothing but
the prompt.
``slowed``: four equal replicas, the fourth of which becomes ten times slower per token
(2k tokens/s prefill, 40 ms a token) ``--slow-at-seconds`` (8) into the run: issue 21's
"a replica that slows down sheds sessions: none waits for it past what another
endpoint's uncached prefill would cost", counted per turn (:func:`slowdown`).
``--quick``: 10 turns a session and a 160k-token cache (the same 1.7x), and the
slowdown at 3 s, for iteration.

Systems (all on the same sessions, bodies and think times; fresh simulators and a
fresh router for each):

- ``latgate`` (default config), ``latgate+prefix_cache`` (``enable_prefix_cache =
  true`` on the provider), ``least_outstanding``, ``round_robin``: latgate's strategies;
- ``vllm-router:cache_aware`` / ``:consistent_hash`` / ``:sticky_least_loaded`` (when the
  installed version has it) and ``litellm:least-busy`` / ``litellm:simple-shuffle``:
  the peers ``benchmarks/setup_peers.sh`` installs;
- ``oracle``: no router; session ``i`` goes straight to replica ``i mod 4``.

``round_robin``, ``least_outstanding``, vllm-router's ``cache_aware``, LiteLLM and the
oracle read no session header: each runs once per replicas kind, with the headers, and
its row stands in both tables. vllm-router's ``consistent_hash`` and
``sticky_least_loaded`` read ``X-Session-ID`` and run with the headers and without.

Measured per system: ``on_most_used`` (the share of a session's turns on its
most-used endpoint: the mean over sessions, and the lowest session), ``max_share``
(the busiest endpoint's requests over the mean per endpoint), ``from_cache`` (prompt
tokens served from cache over prompt tokens, from the simulators' own
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``), TTFT p50 / p90 /
p99 as the client saw it (percentiles as ``harness.percentile``: linear interpolation), the
slow replica's request share, errors. Which endpoint served a turn is read from the
simulators (a session marker in the first user message), the same for every system.
Targets (issue 21) are checked against the oracle and the best peer of the same table.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from harness import PERCENTILES, ROOT, Arrival, Result, percentile, send, wait_until_up
from peers import PEERS, wait_port
from serving import free_port, latgate_serve_command, serve_apps

MODEL = "m"
MARK = b"SESSIONMARK"
"""Leads each session's first user message, followed by the session's 4-digit index."""
BLOCK_TOKENS = 16
REPLICAS = 4
SLOW_REPLICA = "r3"
REPLICA_FIELDS: dict[str, Any] = {
    "prefill_tokens_per_second": 20_000.0,
    "ttft_overhead_ms": 10.0,
    "tpot_ms": 4.0,
    "tpot_growth_ms": 0.05,
    "max_batch_size": 64,
    "prefill_concurrency": 1,
    "prefix_cache": True,
    "prefix_cache_block_tokens": BLOCK_TOKENS,
    "max_output_tokens": 24,
}
SLOW_FIELDS = {"prefill_tokens_per_second": 10_000.0, "tpot_ms": 8.0}
SLOWED_FIELDS = {"prefill_tokens_per_second": 2_000.0, "tpot_ms": 40.0}
"""``slowed``: what the fourth replica becomes ``slow_at_seconds`` into the run (ten times
the time per token: a turn's new tokens then cost more there than a whole history
prefilled again on another replica)."""
REPLICA_KINDS = ("equal", "unequal", "slowed")
LATGATE_SYSTEMS = ("latgate", "latgate+prefix_cache", "least_outstanding", "round_robin")
VLLM_ROUTER_POLICIES = ("cache_aware", "consistent_hash", "sticky_least_loaded")
LITELLM_STRATEGIES = ("least-busy", "simple-shuffle")
PEER_SYSTEMS = tuple(f"vllm-router:{p}" for p in VLLM_ROUTER_POLICIES) + tuple(
    f"litellm:{s}" for s in LITELLM_STRATEGIES
)
ALL_SYSTEMS = (*LATGATE_SYSTEMS, *PEER_SYSTEMS, "oracle")
HEADER_BLIND = frozenset(
    {"round_robin", "least_outstanding", "vllm-router:cache_aware", *(f"litellm:{s}" for s in LITELLM_STRATEGIES), "oracle"}
)
"""Systems that read no session header: run once per replicas kind, their row in both tables."""
SESSION_HEADERS = ("x-claude-code-session-id", "x-session-id")
"""Headers ``on``: the session id as Claude Code sends it, and in the generic header that
vllm-router's ``consistent_hash`` and ``sticky_least_loaded`` key on (without one of its
keys, every request hashes alike: all sessions on one worker)."""
CONFIG = """
[defaults]
timeout_sec = 120
max_retries = 1
[providers.pool]
endpoints = [{endpoints}]
connector = "vllm"
models = ["m"]
{provider_extra}
[routing]
strategy = "{strategy}"
[health]
probe_interval_sec = 2
load_interval_sec = 0.5
"""
CLIENT_TIMEOUT_S = 180.0
WORDS = (
    "the", "file", "function", "returns", "value", "test", "error", "line", "module", "import",
    "class", "self", "config", "path", "string", "list", "read", "write", "call", "result",
    "diff", "patch", "build", "output", "input", "token", "stream", "request", "response", "check",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Workload:
    """The sizes of a run (tokens are ``latgate.routing.tokens`` estimates)."""

    sessions: int = 16
    turns: int = 30
    system_tokens: int = 8_000
    turn_tokens: int = 1_600
    think_seconds: float = 0.4
    start_spread_seconds: float = 2.0
    max_tokens: int = 24
    cache_tokens: int = 400_000
    """Each replica's block cache (the issue's: LRU, 400k tokens)."""
    slow_at_seconds: float = 8.0
    """``slowed``: when (s from the run's start) the fourth replica slows down."""

    @property
    def longest_history_tokens(self) -> int:
        return self.system_tokens + self.turns * self.turn_tokens


QUICK = Workload(turns=10, cache_tokens=160_000, slow_at_seconds=3.0)
"""``--quick``: a third of the turns, the cache scaled by the histories (400k holds 1.8x
four sessions' 30-turn histories; 160k, 1.7x their 10-turn ones)."""


@dataclasses.dataclass(frozen=True)
class SessionPlan:
    """One session: its id, when it starts (s from the run's start), and per turn the
    request body and the think time after the reply (s)."""

    index: int
    session_id: str
    start_s: float
    bodies: tuple[bytes, ...]
    think_s: tuple[float, ...]


def _words(rng: random.Random, tokens: int, tokens_per_word: float) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, int(tokens / tokens_per_word))))


def make_sessions(workload: Workload, *, seed: int) -> list[SessionPlan]:
    """The seeded sessions: the same bodies and think times for every system."""
    from latgate.routing.tokens import estimate_text_tokens

    rng = random.Random(seed)
    sample = _words(random.Random(0), 2_000, 1.0)
    tokens_per_word = estimate_text_tokens(sample) / 2_000
    system = {"role": "system", "content": "You are a coding agent. " + _words(rng, workload.system_tokens, tokens_per_word)}
    plans = []
    for index in range(workload.sessions):
        marker = f"{MARK.decode()}{index:04d} "
        history: list[dict[str, str]] = [system]
        bodies, thinks = [], []
        for turn in range(workload.turns):
            if turn:
                history.append({"role": "assistant", "content": _words(rng, 100, tokens_per_word)})
            text = _words(rng, workload.turn_tokens - (100 if turn else 0), tokens_per_word)
            history.append({"role": "user", "content": (marker if not turn else "") + text})
            body = {
                "model": MODEL,
                "messages": list(history),
                "max_tokens": workload.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            bodies.append(orjson.dumps(body))
            thinks.append(rng.expovariate(1.0 / workload.think_seconds) if workload.think_seconds else 0.0)
        start = rng.uniform(0.0, workload.start_spread_seconds)
        session_id = f"{rng.getrandbits(128):032x}"
        session_id = f"{session_id[:8]}-{session_id[8:12]}-{session_id[12:16]}-{session_id[16:20]}-{session_id[20:]}"
        plans.append(SessionPlan(index, session_id, start, tuple(bodies), tuple(thinks)))
    return plans


# -- simulators --------------------------------------------------------------------------------


def serve_session_sims(spec: dict[str, Any]) -> None:
    """Child process: each simulator of ``spec`` (name -> [port, SimOptions fields]) on one
    loop, with ``GET /bench/served``: ``{"served": [[monotonic time, session index], ...],
    "slowed_at": monotonic time or null}`` of its chat requests (index -1 without a session
    marker), ``POST /bench/slow`` (a JSON object of SimOptions timing fields): the engine
    runs with those from now on, and ``POST /bench/reset``: a fresh simulator (empty
    cache, zero counters, first timing) in its place."""
    from latgate.commands.sim import SimOptions, create_sim_app

    def recorded(options: SimOptions) -> Any:
        state: dict[str, Any] = {"app": create_sim_app(options), "served": [], "slowed_at": None}

        async def wrapped(scope: dict, receive: Any, send_: Any) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and path.startswith("/bench/"):
                if path == "/bench/reset":
                    state.update(app=create_sim_app(options), served=[], slowed_at=None)
                if path == "/bench/slow":
                    raw, more = b"", True
                    while more:
                        message = await receive()
                        raw, more = raw + message.get("body", b""), message.get("more_body", False)
                    engine = state["app"].engine
                    engine.options = dataclasses.replace(engine.options, **orjson.loads(raw))
                    state["slowed_at"] = time.monotonic()
                served = {"served": state["served"], "slowed_at": state["slowed_at"]}
                body = orjson.dumps(served if path == "/bench/served" else {})
                await send_({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
                await send_({"type": "http.response.body", "body": body})
                return
            app, served = state["app"], state["served"]
            if scope["type"] != "http" or not path.endswith("/chat/completions"):
                await app(scope, receive, send_)
                return
            chunks: list[bytes] = []

            async def receive_body() -> dict:
                message = await receive()
                if message["type"] == "http.request":
                    chunks.append(message.get("body", b""))
                    if not message.get("more_body"):
                        raw = b"".join(chunks)
                        at = raw.find(MARK)
                        index = int(raw[at + len(MARK) : at + len(MARK) + 4]) if at >= 0 else -1
                        served.append((time.monotonic(), index))
                return message

            await app(scope, receive_body, send_)

        return wrapped

    serve_apps({port: recorded(SimOptions(name=name, seed=1, **fields)) for name, (port, fields) in spec.items()})


def replica_fields(workload: Workload, replicas: str) -> dict[str, dict[str, Any]]:
    """``{name: SimOptions fields}`` of the four replicas at the start (``equal``,
    ``unequal``; ``slowed`` starts equal)."""
    out = {}
    for n in range(REPLICAS):
        fields = {**REPLICA_FIELDS, "prefix_cache_tokens": workload.cache_tokens}
        if replicas == "unequal" and f"r{n}" == SLOW_REPLICA:
            fields.update(SLOW_FIELDS)
        out[f"r{n}"] = fields
    return out


# -- routers -----------------------------------------------------------------------------------


def system_missing(system: str) -> str | None:
    """Why ``system`` cannot run here, or None."""
    if system in LATGATE_SYSTEMS or system == "oracle":
        return None
    peer, _, policy = system.partition(":")
    binary = PEERS / peer / "bin" / peer
    if not binary.exists():
        return "not installed (benchmarks/setup_peers.sh)"
    if peer == "vllm-router":
        help_text = subprocess.run([str(binary), "--help"], check=False, capture_output=True, text=True, timeout=30).stdout
        if policy not in help_text:
            return f"vllm-router has no policy {policy!r} in this version"
    return None


def _command(system: str, urls: list[str], port: int, tmp: Path) -> list[str]:
    if system in LATGATE_SYSTEMS:
        strategy = "latgate" if system.startswith("latgate") else system
        extra = "enable_prefix_cache = true" if system == "latgate+prefix_cache" else ""
        text = CONFIG.format(
            endpoints=", ".join(f'"{u}/v1"' for u in urls), provider_extra=extra, strategy=strategy
        )
        (tmp / "config.toml").write_text(text)
        return latgate_serve_command(tmp / "config.toml", port=port, log_level="warning")
    peer, _, policy = system.partition(":")
    if peer == "vllm-router":
        return [str(PEERS / "vllm-router" / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--policy", policy, "--worker-urls", *urls,
                "--prometheus-port", str(free_port())]  # fmt: skip  (its fixed default collides with a neighbour's)
    entries = "".join(
        f"  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
        f"      api_base: {url}/v1\n      api_key: sk-bench\n"
        for url in urls
    )
    (tmp / "litellm.yaml").write_text(
        "model_list:\n" + entries + f"router_settings:\n  routing_strategy: {policy}\n"
        "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
        "general_settings:\n  disable_spend_logs: true\n"
    )
    return [str(PEERS / "litellm" / "bin" / "litellm"), "--config", str(tmp / "litellm.yaml"),
            "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]  # fmt: skip


def _env(system: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if system.startswith("litellm"):
        env.update(
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            LITELLM_LOG="ERROR",
            LITELLM_TELEMETRY="False",
            LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true",
        )
    return env


def _wait_routes(base: str, *, seconds: float = 90.0) -> None:
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


@contextlib.contextmanager
def simulators(sims: dict[str, dict[str, Any]]) -> Iterator[dict[str, str]]:
    """The replicas in a child process (``{name: SimOptions fields}``); yields their URLs by
    name. :func:`reset` gives each system fresh ones."""
    spec = {name: (free_port(), fields) for name, fields in sims.items()}
    urls = {name: f"http://127.0.0.1:{port}" for name, (port, _) in spec.items()}
    child = subprocess.Popen([sys.executable, __file__, "--serve-sims", json.dumps(spec)], env=_env("sims"))
    try:
        for url in urls.values():
            wait_until_up(url + "/health")
        yield urls
    finally:
        child.kill()
        child.wait()


def reset(urls: dict[str, str]) -> None:
    """Empty every replica's cache and counters (a fresh simulator behind the same port)."""
    import httpx

    for url in urls.values():
        httpx.post(url + "/bench/reset", timeout=10.0).raise_for_status()


@contextlib.contextmanager
def router(system: str, urls: dict[str, str]) -> Iterator[str | None]:
    """``system`` in front of the replicas (nothing for the oracle); yields its URL."""
    if system == "oracle":
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        process, base = _start(system, list(urls.values()), Path(tmp))
        try:
            yield base
        finally:
            process.kill()
            process.wait()


def _start(system: str, urls: list[str], tmp: Path, *, attempts: int = 3) -> tuple[subprocess.Popen, str]:
    """Start ``system``'s router on a free port and wait until it routes; a start that
    fails (another process took the port between ``free_port`` and the bind: the
    benchmark may run beside others) is tried again on a new port. Raises RuntimeError
    with the log's tail after ``attempts`` failures."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        log = tmp / f"router-{attempt}.log"
        with log.open("wb") as out:  # the peers log every request: kept out of the report
            quiet = None if system in LATGATE_SYSTEMS else out
            process = subprocess.Popen(_command(system, urls, port, tmp), env=_env(system), stdout=quiet, stderr=quiet)
        base = f"http://127.0.0.1:{port}"
        try:
            if system in LATGATE_SYSTEMS:
                wait_until_up(base + "/readyz", seconds=60.0)
            else:
                wait_port(port, timeout=120.0, proc=process)
                _wait_routes(base)
            return process, base
        except RuntimeError as exc:
            process.kill()
            process.wait()
            tail = log.read_bytes()[-600:].decode(errors="replace")
            print(f"{system}: start {attempt} of {attempts} failed ({exc}): {tail}", file=sys.stderr, flush=True)
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


# -- the load generator --------------------------------------------------------------------------


async def _sim_counters(http: aiohttp.ClientSession, urls: dict[str, str]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, url in urls.items():
        async with http.get(url + "/metrics") as response:
            text = await response.text()
        async with http.get(url + "/bench/served") as response:
            served = orjson.loads(await response.read())
        out[name] = {
            "queried": _sample(text, "vllm:prefix_cache_queries_total"),
            "hit": _sample(text, "vllm:prefix_cache_hits_total"),
            "served": served["served"],
            "slowed_at": served["slowed_at"],
        }
    return out


def _sample(text: str, name: str) -> float:
    """The value of the first sample of series ``name`` in a Prometheus text (0 if none)."""
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def drive(
    plans: list[SessionPlan],
    base: str | None,
    sims: dict[str, str],
    *,
    headers: bool,
    slow: tuple[str, float, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Run every session against ``base`` (the oracle: straight to its replica); returns
    the turns' results and what each simulator counted meanwhile. ``slow``: (replica,
    seconds from the start, SimOptions timing fields) that replica takes on then."""
    names = list(sims)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        before = await _sim_counters(http, sims)
        started = time.perf_counter()
        results: list[tuple[int, int, Result]] = []

        async def session(plan: SessionPlan) -> None:
            target = base if base is not None else sims[names[plan.index % len(names)]]
            url = target + "/v1/chat/completions"
            extra = dict.fromkeys(SESSION_HEADERS, plan.session_id) if headers else {}
            await asyncio.sleep(max(0.0, started + plan.start_s - time.perf_counter()))
            for turn, (body, think) in enumerate(zip(plan.bodies, plan.think_s, strict=True)):
                result = await send(http, url, Arrival(at_s=0.0, kind=str(plan.index), body=body, headers=extra))
                results.append((plan.index, turn, result))
                if turn < len(plan.bodies) - 1:
                    await asyncio.sleep(think)

        async def slow_down(name: str, at_s: float, fields: dict[str, float]) -> None:
            await asyncio.sleep(max(0.0, started + at_s - time.perf_counter()))
            async with http.post(sims[name] + "/bench/slow", json=fields) as response:
                response.raise_for_status()

        await asyncio.gather(*(session(plan) for plan in plans), *([slow_down(*slow)] if slow else []))
        elapsed = time.perf_counter() - started
        after = await _sim_counters(http, sims)
    counted = {
        name: {
            "queried": after[name]["queried"] - before[name]["queried"],
            "hit": after[name]["hit"] - before[name]["hit"],
            "served": [index for _, index in after[name]["served"][len(before[name]["served"]) :]],
            "served_at": [at for at, _ in after[name]["served"][len(before[name]["served"]) :]],
            "slowed_at": after[name]["slowed_at"],
        }
        for name in names
    }
    return {"results": results, "sims": counted, "elapsed_s": elapsed}


def summarize(observed: dict[str, Any], *, sessions: int) -> dict[str, Any]:
    """One system's numbers (see the module docstring)."""
    results: list[tuple[int, int, Result]] = observed["results"]
    sims: dict[str, dict[str, Any]] = observed["sims"]
    served = {name: [i for i in counted["served"] if i >= 0] for name, counted in sims.items()}
    per_session = []
    for index in range(sessions):
        counts = [row.count(index) for row in served.values()]
        if sum(counts):
            per_session.append(max(counts) / sum(counts))
    requests = {name: len(row) for name, row in served.items()}
    mean = sum(requests.values()) / len(requests)
    queried = sum(c["queried"] for c in sims.values())
    hit = sum(c["hit"] for c in sims.values())
    ttft = [r.ttft_s for _, _, r in results if r.ok and r.ttft_s is not None]
    return {
        "turns": len(results),
        "errors": sum(1 for _, _, r in results if not r.ok),
        "on_most_used": _r(sum(per_session) / len(per_session)) if per_session else None,
        "on_most_used_min": _r(min(per_session)) if per_session else None,
        "max_share": _r(max(requests.values()) / mean) if mean else None,
        "requests": requests,
        "slow_share": _r(requests.get(SLOW_REPLICA, 0) / sum(requests.values())) if sum(requests.values()) else None,
        "from_cache": _r(hit / queried) if queried else None,
        "cached_tokens": int(hit),
        "prompt_tokens": int(queried),
        "ttft_p50_s": _r(percentile(ttft, 50)),
        "ttft_p90_s": _r(percentile(ttft, 90)),
        "ttft_p99_s": _r(percentile(ttft, 99)),
        "elapsed_s": round(observed["elapsed_s"], 1),
    }


def slowdown(
    observed: dict[str, Any], prompt_tokens: dict[tuple[int, int], int], *, replica: str = SLOW_REPLICA
) -> dict[str, Any]:
    """How a system met ``replica`` slowing down mid-run (``{}`` if it did not slow).

    ``prompt_tokens``: each turn's prompt, ``(session index, turn) -> tokens``. A session's
    k-th request the simulators saw is its turn k (sessions send one turn at a time; a
    session with more or fewer requests than results, a retry, is left out). Of the turns
    that reached ``replica`` after it slowed, ``waits_past_uncached`` counts those whose
    TTFT exceeded what the whole prompt costs uncached on an unslowed replica (fixed
    overhead plus prompt tokens at its prefill rate), ``worst_excess_s`` the largest
    excess (s); the shares are ``replica``'s of the turns that arrived before and after.
    """
    sims = observed["sims"]
    slowed_at = sims[replica].get("slowed_at")
    if slowed_at is None:
        return {}
    seen: dict[int, list[tuple[float, str]]] = {}
    for name, counted in sims.items():
        for at, index in zip(counted["served_at"], counted["served"], strict=True):
            if index >= 0:
                seen.setdefault(index, []).append((at, name))
    results = {(index, turn): result for index, turn, result in observed["results"]}
    turns: dict[int, int] = {}
    for index, _ in results:
        turns[index] = turns.get(index, 0) + 1
    counts = {"before": [0, 0], "after": [0, 0]}  # [turns, on replica]
    excess: list[float] = []
    late_turns: list[dict[str, Any]] = []
    overhead_s = REPLICA_FIELDS["ttft_overhead_ms"] / 1000.0
    for index, rows in seen.items():
        if len(rows) != turns.get(index):
            continue
        for turn, (at, name) in enumerate(sorted(rows)):
            phase = counts["after" if at >= slowed_at else "before"]
            phase[0] += 1
            phase[1] += name == replica
            result = results[(index, turn)]
            if at >= slowed_at and name == replica and result.ok and result.ttft_s is not None:
                bound_s = overhead_s + prompt_tokens[(index, turn)] / REPLICA_FIELDS["prefill_tokens_per_second"]
                excess.append(result.ttft_s - bound_s)
                previous = sorted(rows)[turn - 1][1] if turn else None
                if result.ttft_s > bound_s:
                    late_turns.append({
                        "session": index, "turn": turn, "after_slowed_s": _r(at - slowed_at),
                        "ttft_s": _r(result.ttft_s), "bound_s": _r(bound_s), "previous_turn_on": previous,
                    })  # fmt: skip
    late = [e for e in excess if e > 0]
    return {
        "slowed_share_before": _r(counts["before"][1] / counts["before"][0]) if counts["before"][0] else None,
        "slowed_share_after": _r(counts["after"][1] / counts["after"][0]) if counts["after"][0] else None,
        "slowed_turns_after": counts["after"][1],
        "waits_past_uncached": len(late),
        "worst_excess_s": _r(max(late)) if late else 0.0,
        "late_turns": late_turns,
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# -- targets and the table -------------------------------------------------------------------------


def targets(rows: dict[str, dict[str, Any]], *, headers: bool, system: str = "latgate") -> dict[str, Any]:
    """Issue 21's targets for ``system`` against the oracle and the best peer of ``rows``."""
    row = rows.get(system)
    oracle = rows.get("oracle")
    if not row or "skipped" in row or not oracle or "skipped" in oracle:
        return {}
    peers = [r for name, r in rows.items() if name in PEER_SYSTEMS and "skipped" not in r and r["ttft_p99_s"]]
    best_peer_p99 = min((r["ttft_p99_s"] for r in peers), default=None)
    out: dict[str, Any] = {
        "on_most_used": {"want": ">= 0.85" if headers else ">= 0.75", "got": row["on_most_used"],
                         "met": row["on_most_used"] is not None and row["on_most_used"] >= (0.85 if headers else 0.75)},
        "max_share": {"want": "<= 1.3", "got": row["max_share"], "met": row["max_share"] is not None and row["max_share"] <= 1.3},
    }  # fmt: skip
    if headers:
        cache_ratio = row["from_cache"] / oracle["from_cache"] if oracle["from_cache"] else None
        p99_ratio = row["ttft_p99_s"] / oracle["ttft_p99_s"] if oracle["ttft_p99_s"] else None
        out["from_cache_vs_oracle"] = {"want": ">= 0.9", "got": _r(cache_ratio), "met": cache_ratio is not None and cache_ratio >= 0.9}
        out["p99_vs_oracle"] = {"want": "<= 3", "got": _r(p99_ratio), "met": p99_ratio is not None and p99_ratio <= 3}
        if best_peer_p99:
            ratio = row["ttft_p99_s"] / best_peer_p99
            out["p99_vs_best_peer"] = {"want": "<= 0.25", "got": _r(ratio), "met": ratio <= 0.25}
    if "waits_past_uncached" in row:
        waits = row["waits_past_uncached"]
        out["waits_past_uncached"] = {"want": "0", "got": waits, "met": waits == 0}
    return out


def table(rows: dict[str, dict[str, Any]], *, slow: bool, slowed: bool = False) -> str:
    """Markdown: one row per system (``slowed``: the slowdown's columns too)."""
    head = "| system | turns on most-used endpoint (mean / lowest session) | busiest endpoint / mean | prompt tokens from cache | TTFT p50 / p90 / p99 (s) |"
    rule = "|---|---|---|---|---|"
    if slow:
        head += " slow replica's requests |"
        rule += "---|"
    if slowed:
        head += " slowed replica's turns before / after it slowed | of those after, TTFT past an uncached prefill elsewhere (worst excess) |"
        rule += "---|---|"
    lines = [head + " errors |", rule + "---|"]
    for name, row in rows.items():
        if "skipped" in row:
            lines.append(f"| {name} | skipped: {row['skipped']} |")
            continue
        line = (
            f"| {name} | {_pct(row['on_most_used'])} / {_pct(row['on_most_used_min'])} | {row['max_share']}x | "
            f"{_pct(row['from_cache'])} | {row['ttft_p50_s']} / {row['ttft_p90_s']} / {row['ttft_p99_s']} |"
        )
        if slow:
            line += f" {_pct(row['slow_share'])} |"
        if slowed:
            line += (
                f" {_pct(row.get('slowed_share_before'))} / {_pct(row.get('slowed_share_after'))} |"
                f" {row.get('waits_past_uncached')} of {row.get('slowed_turns_after')} ({row.get('worst_excess_s')} s) |"
            )
        lines.append(line + f" {row['errors']} |")
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{round(100 * value)}%"


# -- main ----------------------------------------------------------------------------------------------


def run(
    workload: Workload, *, systems: list[str], replicas: list[str], headers: list[str], seed: int
) -> dict[str, Any]:
    """Every case (replicas x headers) under every system; returns the JSON document."""
    from latgate.routing.tokens import estimate_prompt_tokens

    plans = make_sessions(workload, seed=seed)
    prompt_tokens = (
        {(p.index, t): estimate_prompt_tokens(orjson.loads(b)) for p in plans for t, b in enumerate(p.bodies)}
        if "slowed" in replicas
        else {}
    )
    cases: dict[str, Any] = {}
    missing = {system: system_missing(system) for system in systems}
    for kind in replicas:
        shared: dict[str, dict[str, Any]] = {}  # header-blind systems, run once per replicas kind
        with simulators(replica_fields(workload, kind)) as urls:
            for header in headers:
                rows: dict[str, dict[str, Any]] = {}
                for system in systems:
                    blind = system in HEADER_BLIND
                    if blind and system in shared:
                        rows[system] = shared[system]
                        continue
                    if missing[system]:
                        rows[system] = {"skipped": missing[system]}
                        continue
                    reset(urls)
                    slow = (SLOW_REPLICA, workload.slow_at_seconds, SLOWED_FIELDS) if kind == "slowed" else None
                    with router(system, urls) as base:
                        observed = asyncio.run(drive(plans, base, urls, headers=blind or header == "on", slow=slow))
                    rows[system] = summarize(observed, sessions=workload.sessions)
                    rows[system].update(slowdown(observed, prompt_tokens))
                    if blind:
                        shared[system] = rows[system]
                    print(f"{kind} / headers {header} / {system}: {json.dumps(rows[system])}", flush=True)
                cases[f"{kind}-headers-{header}"] = {
                    "replicas": kind,
                    "headers": header,
                    "systems": rows,
                    "targets": targets(rows, headers=header == "on"),
                }
    return {
        "workload": {**dataclasses.asdict(workload), "cache_tokens_per_replica": workload.cache_tokens},
        "replica": REPLICA_FIELDS,
        "slow_replica": {"name": SLOW_REPLICA, **SLOW_FIELDS},
        "slowed_replica": {"name": SLOW_REPLICA, "at_seconds": workload.slow_at_seconds, **SLOWED_FIELDS},
        "seed": seed,
        "percentiles": PERCENTILES,
        "cases": cases,
    }


def markdown(document: dict[str, Any]) -> str:
    """Every case's table and latgate's targets."""
    parts = []
    for case, body in document["cases"].items():
        parts.append(f"### {body['replicas']} replicas, session headers {body['headers']}\n")
        parts.append(table(body["systems"], slow=body["replicas"] == "unequal", slowed=body["replicas"] == "slowed"))
        met = body["targets"]
        if met:
            summary = ", ".join(f"{k} {v['got']} ({v['want']}: {'met' if v['met'] else 'missed'})" for k, v in met.items())
            parts.append(f"\nlatgate against the targets: {summary}.\n")
        else:
            parts.append("")
        del case
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT", type=Path, help="write the results as JSON")
    parser.add_argument("--markdown", metavar="OUT", type=Path, help="write the tables as markdown")
    parser.add_argument("--quick", action="store_true", help="10 turns a session (QUICK), for iteration")
    parser.add_argument("--sessions", type=int)
    parser.add_argument("--turns", type=int, help="turns per session")
    parser.add_argument("--system-tokens", type=int)
    parser.add_argument("--turn-tokens", type=int, help="new tokens per turn")
    parser.add_argument("--think-seconds", type=float, help="mean think time")
    parser.add_argument("--cache-tokens", type=int, help="each replica's prefix cache")
    parser.add_argument("--slow-at-seconds", type=float, help="slowed: when the fourth replica slows down")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS), help="comma-separated (default: all)")
    parser.add_argument("--replicas", default="equal,unequal,slowed", help="comma-separated: equal, unequal, slowed")
    parser.add_argument("--headers", default="on,off", help="on, off or both")
    parser.add_argument("--serve-sims", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_sims:
        serve_session_sims(json.loads(args.serve_sims))
        return 0
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in ALL_SYSTEMS]
    if unknown:
        print(f"sessions: error: unknown system {unknown[0]!r}; choose from {', '.join(ALL_SYSTEMS)}", file=sys.stderr)
        return 2
    sizes = {
        name: value
        for name in ("sessions", "turns", "system_tokens", "turn_tokens", "think_seconds", "cache_tokens", "slow_at_seconds")
        if (value := getattr(args, name)) is not None
    }
    workload = dataclasses.replace(QUICK if args.quick else Workload(), **sizes)
    started = time.monotonic()
    document = run(
        workload,
        systems=systems,
        replicas=[r.strip() for r in args.replicas.split(",") if r.strip()],
        headers=[h.strip() for h in args.headers.split(",") if h.strip()],
        seed=args.seed,
    )
    document["run_seconds"] = round(time.monotonic() - started, 1)
    text = markdown(document)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
