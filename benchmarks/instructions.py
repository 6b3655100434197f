"""Instructions per proxied request, counted by valgrind's callgrind: a figure that does
not move with the machine's load, for comparing two versions of latgate in one run.

    .venv/bin/python benchmarks/instructions.py [--requests 800] [--concurrency 16]
        [--mode non-stream|stream|agent|anthropic] [--state off|memory|redis|both] [--endpoints 1|2|3]
        [--baseline-src PATH/TO/OTHER/src] [--keep-profile OUT] [--prefix-cache on|off]
        [--upstream-key]

latgate runs under callgrind with instrumentation off while it starts and warms up
(200 requests), on for the measured requests, then off again; the zero-delay mock
upstream (``mock_upstream.py``) and the load generator run natively. ``--mode agent``
sends the ~100 KB Cline-like chat body of ``agent_bodies.py``, ``--mode anthropic`` its
~100 KB Claude-Code-like ``/v1/messages`` body (content blocks, ``tool_use`` /
``tool_result``), both non-streamed; the other modes a two-word chat. With
``--baseline-src`` (e.g. ``git worktree add /tmp/base HEAD~5`` then
``--baseline-src /tmp/base/src``) the same is done for that tree (put first on
``PYTHONPATH``) and the ratio printed. ``--keep-profile OUT`` keeps this tree's
callgrind output as ``OUT`` (read it with ``callgrind_annotate --inclusive=yes OUT``:
where the instructions go by C function, e.g. orjson, the allocator, the interpreter).
``--state`` runs latgate with ``[auth]`` and RPM/TPM limits (never reached), in process
(``memory``), with ``[state] redis_url`` on a throw-away ``redis-server`` (``redis``;
the Redis script calls per request are counted from its ``INFO``), or both in one run
with their ratio. ``--endpoints 2`` (or 3) gives the provider that many endpoints (the
same mock upstream under other host names), so the endpoint choice and, for a body
with messages, the prefix index run on every request; ``--prefix-cache off`` turns the
index off in this tree (``enable_prefix_cache = false``), to tell its cost from the
rest. ``--upstream-key`` gives the provider a key (``api_key_env``, both trees), so the
per-chunk and per-answer search for its echoes runs. Needs ``valgrind`` (Debian package).

Counts repeat within ~0.5% run to run; CPU time per request on this project's shared
2-core machines moves by ±30%. Instructions are not time (cache misses, syscalls and
the kernel are not in them), so ``overhead.py`` stays the benchmark of record.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_bodies import chat_body, messages_body
from loadgen import Conn, request_bytes
from peers import Latgate, Redis, wait_port
from serving import free_port, latgate_serve_command

WARM_UP_REQUESTS = 200


async def send_exactly(*, port: int, request: bytes, total: int, concurrency: int) -> int:
    """``total`` requests (rounded down to a multiple of ``concurrency``) over
    ``concurrency`` keep-alive connections; returns how many were sent."""
    loop = asyncio.get_running_loop()
    conns = []
    for _ in range(concurrency):
        _, conn = await loop.create_connection(lambda: Conn(gaps=False), "127.0.0.1", port)
        conns.append(conn)
    each = total // concurrency

    async def slot(conn: Conn) -> None:
        for _ in range(each):
            await conn.send(request)
            if conn.status != 200:
                raise RuntimeError(f"latgate answered {conn.status}")

    await asyncio.gather(*(slot(c) for c in conns))
    for conn in conns:
        conn.transport.close()
    return each * concurrency


def redis_scripts(url: str) -> int:
    """Script calls (``EVALSHA`` and ``EVAL``) the Redis at ``url`` has run (its ``INFO
    commandstats``; the commands a script runs are counted there too, so not summed)."""
    port = url.rsplit(":", 1)[1].split("/")[0]
    out = subprocess.run(
        ["redis-cli", "-p", port, "info", "commandstats"], check=True, capture_output=True, text=True
    )
    calls = 0
    for line in out.stdout.splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            calls += int(line.split("calls=")[1].split(",")[0])
    return calls


def measure(
    *,
    src: str | None,
    mode: str,
    requests: int,
    concurrency: int,
    workdir: Path,
    keep: str | None = None,
    limits: bool = False,
    redis_url: str | None = None,
    endpoints: int = 1,
    prefix_cache: bool = True,
    upstream_key: bool = False,
) -> float:
    """Instructions per request (thousands) of the latgate in ``src`` (None: this one),
    with ``[auth]`` and limits when ``limits``, in Redis when ``redis_url``; its
    callgrind output copied to ``keep`` when given; without ``prefix_cache`` the provider
    sets ``enable_prefix_cache = false`` (no prefix index, no sessions)."""
    up_port, gw_port = free_port(), free_port()
    mock = subprocess.Popen([sys.executable, str(Path(__file__).with_name("mock_upstream.py")), str(up_port)])
    config = workdir / "config.toml"
    text = Latgate(limits=limits, redis_url=redis_url).config_text(up_port)
    if endpoints > 1:  # the same mock under other names: the endpoint choice (and the prefix index) runs
        names = ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"][:endpoints]
        urls = ", ".join(f'"http://{name}:{up_port}/v1"' for name in names)
        text = text.replace(f'api_base = "http://127.0.0.1:{up_port}/v1"', f"endpoints = [{urls}]")
    if not prefix_cache:
        text = text.replace("[providers.up]\n", "[providers.up]\nenable_prefix_cache = false\n")
    if upstream_key:
        text = text.replace("[providers.up]\n", '[providers.up]\napi_key_env = "LATGATE_BENCH_UPSTREAM_KEY"\n')
    # under callgrind latgate runs ~50x slower: a 100 ms Redis bound would fail calls open
    config.write_text(text + ("redis_timeout_ms = 10000\n" if redis_url else ""))
    out = workdir / "callgrind.out"
    env = dict(os.environ)
    if upstream_key:  # a key of a hosted provider's shape
        env["LATGATE_BENCH_UPSTREAM_KEY"] = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" * 2
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    command = latgate_serve_command(config, port=gw_port)
    gateway = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_port(up_port, timeout=30)
        wait_port(gw_port, timeout=600, proc=gateway)
        path = "/v1/chat/completions"
        if mode == "agent":  # the ~100 KB Cline-like body of agent_bodies.py
            body = chat_body("bench", stream=False)
        elif mode == "anthropic":  # the ~100 KB Claude-Code-like /v1/messages body of agent_bodies.py
            body, path = messages_body("bench", stream=False), "/v1/messages"
        else:
            body = json.dumps(
                {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": mode == "stream"}
            ).encode()
        request = request_bytes(port=gw_port, path=path, body=body)
        asyncio.run(send_exactly(port=gw_port, request=request, total=WARM_UP_REQUESTS, concurrency=concurrency))
        subprocess.run(["callgrind_control", "-i", "on", str(gateway.pid)], check=True, capture_output=True)
        scripts = redis_scripts(redis_url) if redis_url else 0
        sent = asyncio.run(send_exactly(port=gw_port, request=request, total=requests, concurrency=concurrency))
        if redis_url:
            print(f"  Redis script calls per request: {(redis_scripts(redis_url) - scripts) / sent:.2f}")
        subprocess.run(["callgrind_control", "-i", "off", str(gateway.pid)], check=True, capture_output=True)
    finally:
        gateway.terminate()
        mock.terminate()
        gateway.wait()
        mock.wait()
    total, biggest = 0, None
    for path in glob.glob(f"{out}*"):
        for line in Path(path).read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")) and int(line.split()[1]) > total:
                total, biggest = int(line.split()[1]), path
    if keep and biggest:
        shutil.copyfile(biggest, keep)
    return total / sent / 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--mode", choices=["non-stream", "stream", "agent", "anthropic"], default="non-stream")
    parser.add_argument("--endpoints", type=int, choices=[1, 2, 3], default=1)
    parser.add_argument(
        "--prefix-cache",
        choices=["on", "off"],
        default="on",
        help="off: enable_prefix_cache = false, this tree only (what the prefix index and sessions cost)",
    )
    parser.add_argument("--upstream-key", action="store_true", help="the provider has a key (its echoes are searched)")
    parser.add_argument("--baseline-src", help="another latgate source tree (its src/ folder) to compare")
    parser.add_argument("--keep-profile", metavar="OUT", help="keep this tree's callgrind output as OUT")
    parser.add_argument(
        "--state",
        choices=["off", "memory", "redis", "both"],
        default="off",
        help="[auth] with RPM/TPM limits: in process, in a local redis-server, or both (and their ratio)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("instructions.py needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    states = {"off": [None], "memory": ["memory"], "redis": ["redis"], "both": ["memory", "redis"]}[args.state]
    redis = Redis()
    redis_url = redis.start() if "redis" in states else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            this: dict[str | None, float] = {}
            for src in [None, *([args.baseline_src] if args.baseline_src else [])]:
                counts: dict[str | None, float] = {}
                for state in states:
                    limited = f", limits {state}" if state else ""
                    print(f"{src or 'latgate'} ({args.mode}, c={args.concurrency}{limited})", flush=True)
                    counts[state] = measure(
                        src=src,
                        mode=args.mode,
                        requests=args.requests,
                        concurrency=args.concurrency,
                        workdir=Path(tmp),
                        keep=args.keep_profile if src is None and len(states) == 1 else None,
                        limits=state is not None,
                        redis_url=redis_url if state == "redis" else None,
                        endpoints=args.endpoints,
                        prefix_cache=args.prefix_cache == "on" or src is not None,
                        upstream_key=args.upstream_key,
                    )
                    print(f"  {counts[state]:.1f} k instructions per request", flush=True)
                if len(states) == 2:
                    print(f"  redis / memory = {counts['redis'] / counts['memory']:.3f}")
                if src is None:
                    this = counts
                else:
                    ratios = ", ".join(f"{s or 'off'} {this[s] / counts[s]:.3f}" for s in states)
                    print(f"this / baseline: {ratios}")
    finally:
        redis.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
