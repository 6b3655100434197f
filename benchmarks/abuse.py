"""Hostile clients and overload against a healthy upstream, on loopback, bounded in time.

    .venv/bin/python benchmarks/abuse.py [--load-seconds 25] [--soft-nofile 1024]
        [--baseline-src /tmp/before/src] [--json OUT]

Set-up (2 cores): the gateway (``latgate serve``, access log off) alone on core 0
(``taskset``), started with a soft descriptor limit of ``--soft-nofile`` (1,024 is a
common default; the hard limit stays); on core 1 the clients, the probes and two
upstreams: ``healthy``, the probe's and the concurrent streams' upstream, is the uvloop
mock (``mock_upstream.py``: a paced stream of 40 chunks 500 ms apart, a one-token
answer at once), light enough that the burst does not make the upstream itself the
bottleneck; ``bulk``, an engine simulator (``latgate sim``: fast, long answers, for the
streams nobody reads and the stall measurement). With ``--baseline-src`` the gateway runs that source
tree instead (e.g. ``git worktree add /tmp/before main``), with a config the older code
accepts (no ``[server]`` client limits); simulators and clients are this tree's.

Load, all at once, for ``--load-seconds``:

- 1,000 idle connections that never send a byte;
- 50 slowloris clients sending a request head one byte a second;
- 20 streams whose client never reads (``bulk``: 4,096 tokens each);
- 1,100 concurrent streams read to the end (``healthy``: 40 chunks, 20 s each);
- meanwhile a probe client sends a normal request (non-streamed, one token, a new
  connection each) every 0.2 s, from a process of its own (this one's event loop is
  busy with the load), and a second one sends the same straight to the upstream at the
  same time. Each reports its three slowest probes with when they were sent; latgate's
  share is its p99 over the direct probe's (``latgate_added_p99_ms``) and over the
  unloaded run's.

First, how long a fast stream's chunks stall (read from a process of its own) while a
~30 MB body of 700k messages is proxied beside it and three more come from a key over
its request rate (how soon they get their 429), and the gateway's RSS once those requests ended. Then, before the
load, the same probes run unloaded. Reported: the probe's p50/p99 and
errors (unloaded and loaded), the streams' outcomes, how many abusive connections the
gateway closed and how soon, the gateway's peak RSS and descriptors (``/proc``), and
from ``/metrics`` after the load: ejections, upstream errors, retries. The gateway's
client timeouts are shortened to 5 s so the run stays bounded (the defaults are 30/60/60
s). Loopback only; every process is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import percentile
from serving import free_port, latgate_serve_command
from soak import rss_mb, wait_ready

CLIENT_TIMEOUT_SECONDS = 5
CONFIG = """
[defaults]
timeout_sec = 60
connect_timeout_sec = 5
max_retries = 1

[providers.healthy]
api_base = "http://127.0.0.1:{healthy}/v1"
models = ["m", "bench-paced"]

[providers.bulk]
api_base = "http://127.0.0.1:{bulk}/v1"
models = ["bulk"]

[routing]
default_route = "healthy"

[auth]
[[auth.keys]]
name = "client"
key = "sk-client"

[[auth.keys]]
name = "limited"
key = "sk-limited"
rpm = 1
"""
LIMITS = f"""
[server]
header_timeout_sec = {CLIENT_TIMEOUT_SECONDS}
body_timeout_sec = {CLIENT_TIMEOUT_SECONDS}
send_timeout_sec = {CLIENT_TIMEOUT_SECONDS}
"""
HEALTHY = ["--pace-ms", "500", "--paced-chunks", "40"]
BULK = ["--tpot-ms", "1", "--tpot-growth-ms", "0", "--max-batch-size", "64", "--max-output-tokens", "4096"]


def request_bytes(port: int, body: dict | bytes, *, key: str = "sk-client") -> bytes:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
        % (port, key.encode(), len(payload))
    ) + payload


def chat(model: str, *, max_tokens: int, stream: bool) -> dict:
    return {"model": model, "max_tokens": max_tokens, "stream": stream, "messages": [{"role": "user", "content": "hello"}]}


async def exchange(port: int, data: bytes, *, timeout: float) -> tuple[str, bytes]:
    """Send ``data`` on a new connection, read to EOF: ``(outcome, bytes)``; outcome is
    the status code, ``eof`` (closed without an answer), ``reset``, ``refused``, ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(data)
                answer = await reader.read()
            finally:
                writer.close()
    except TimeoutError:
        return "timeout", b""
    except ConnectionRefusedError:
        return "refused", b""
    except OSError:
        return "reset", b""
    if not answer:
        return "eof", b""
    return answer[9:12].decode(errors="replace"), answer


async def probe(port: int, *, until: float, interval: float, count: int | None = None) -> list[tuple[float, str, float]]:
    """Normal requests, one at a time: ``(seconds, outcome, sent at)`` each (monotonic)."""
    results: list[tuple[float, str, float]] = []
    data = request_bytes(port, chat("m", max_tokens=1, stream=False))
    while time.monotonic() < until and (count is None or len(results) < count):
        started = time.monotonic()
        outcome, _ = await exchange(port, data, timeout=10)
        results.append((time.monotonic() - started, outcome, started))
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    return results


async def hold_idle(port: int, opened: float, closes: list[float | None], index: int, *, trickle: bytes = b"") -> None:
    """Connect and send nothing (or ``trickle`` one byte a second); note when the server closed."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    try:
        async def trickling() -> None:
            for byte in trickle:
                writer.write(bytes([byte]))
                await asyncio.sleep(1.0)

        sender = asyncio.create_task(trickling())
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass
        closes[index] = time.monotonic() - opened
        sender.cancel()
    finally:
        writer.close()


async def unread_stream(port: int, sockets: list[socket.socket]) -> None:
    """A stream whose client never reads (a small receive buffer, nothing read)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    with contextlib.suppress(OSError):
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        await asyncio.get_running_loop().sock_sendall(sock, request_bytes(port, chat("bulk", max_tokens=4096, stream=True)))
    sockets.append(sock)


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed ``sock`` (EOF or reset after whatever it had sent)."""
    sock.setblocking(True)
    sock.settimeout(0.2)
    try:
        while sock.recv(1 << 20):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


async def stream(port: int, outcomes: dict[str, int]) -> None:
    outcome, answer = await exchange(port, request_bytes(port, chat("bench-paced", max_tokens=40, stream=True)), timeout=90)
    if outcome == "200" and (b"[DONE]" not in answer or b'"error"' in answer):
        outcome = "200 incomplete"
    outcomes[outcome] = outcomes.get(outcome, 0) + 1


async def stream_gaps(port: int) -> float:
    """Read a fast stream (``bulk``: a chunk a millisecond); the longest gap between two
    reads, in ms: how long the gateway's event loop stalled."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(port, chat("bulk", max_tokens=3000, stream=True)))
    longest, last = 0.0, None
    try:
        while data := await reader.read(65536):
            now = time.monotonic()
            if last is not None and b"content" in data:
                longest = max(longest, now - last)
            last = now
    finally:
        writer.close()
    return round(longest * 1000, 1)


async def big_bodies(port: int) -> dict:
    """The longest stall of a fast stream alone, then while one ~30 MB body (700k small
    messages) is proxied and three more come from a key already over its request rate."""
    alone = await stream_gaps_process(port)
    messages = [{"role": "user", "content": f"m {i}"} for i in range(700_000)]
    body = json.dumps({"model": "m", "max_tokens": 1, "messages": messages}).encode()
    await exchange(port, request_bytes(port, chat("m", max_tokens=1, stream=False), key="sk-limited"), timeout=10)
    requests = [request_bytes(port, body), *(request_bytes(port, body, key="sk-limited") for _ in range(3))]
    del messages, body
    # the stream is read in a process of its own: this one's loop copies the 4 bodies
    # into its sockets' buffers, which would show as the stream's stall
    stream_task = asyncio.create_task(stream_gaps_process(port))
    await asyncio.sleep(1.0)
    started = time.monotonic()

    async def timed(data: bytes) -> tuple[str, float]:
        outcome, _ = await exchange(port, data, timeout=120)
        return outcome, round(time.monotonic() - started, 2)

    answers = await asyncio.gather(*(timed(data) for data in requests))
    body_mb = round(len(requests[0]) / 1e6, 1)
    del requests
    return {
        "stream_longest_gap_ms_alone": alone,
        "stream_longest_gap_ms_with_big_bodies": await stream_task,
        "big_body": {"outcome": answers[0][0], "seconds": answers[0][1]},
        "over_rpm_bodies": [{"outcome": outcome, "seconds": seconds} for outcome, seconds in answers[1:]],
        "body_mb": body_mb,
    }


async def stream_gaps_process(port: int) -> float:
    """:func:`stream_gaps` in a child process (``abuse.py --stream-gaps PORT``)."""
    child = await asyncio.create_subprocess_exec(sys.executable, __file__, "--stream-gaps", str(port), stdout=subprocess.PIPE)
    out, _ = await child.communicate()
    return float(out)


async def probe_process(port: int, *, until: float) -> list[tuple[float, str, float]]:
    """:func:`probe` every 0.2 s until ``until`` (monotonic: one clock for every process
    on Linux) in a child process (``abuse.py --probe PORT UNTIL``)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--probe", str(port), repr(until), stdout=subprocess.PIPE
    )
    out, _ = await child.communicate()
    return [tuple(row) for row in json.loads(out)]  # type: ignore[misc]


def summary(results: list[tuple[float, str, float]], *, origin: float | None = None) -> dict:
    """p50/p99 of the answered probes and the errors; with ``origin`` (the load's start)
    also the three slowest, each as ``[ms, seconds after the load began]``."""
    ok = [seconds * 1000 for seconds, outcome, _ in results if outcome == "200"]
    errors: dict[str, int] = {}
    for _, outcome, _ in results:
        if outcome != "200":
            errors[outcome] = errors.get(outcome, 0) + 1
    out = {"requests": len(results), "p50_ms": round(percentile(ok, 50, empty=math.nan), 1), "p99_ms": round(percentile(ok, 99, empty=math.nan), 1), "errors": errors}
    if origin is not None:
        slowest = sorted(results, reverse=True)[:3]
        out["slowest_ms_at_s"] = [[round(seconds * 1000, 1), round(at - origin, 2)] for seconds, _, at in slowest]
    return out


def gateway_sample(pid: int) -> tuple[float, int]:
    try:
        return rss_mb(pid), len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return 0.0, 0


def metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


async def run_load(port: int, pid: int, args: argparse.Namespace, *, upstream_port: int) -> dict:
    unloaded = await probe(port, until=time.monotonic() + 20, interval=0.05, count=60)
    direct_unloaded = await probe(upstream_port, until=time.monotonic() + 20, interval=0.05, count=60)
    rss_before_load, _ = gateway_sample(pid)  # what the earlier big bodies left
    opened = time.monotonic()
    idle_closes: list[float | None] = [None] * 1000
    slow_closes: list[float | None] = [None] * 50
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
    unread: list[socket.socket] = []
    stream_outcomes: dict[str, int] = {}
    tasks = [asyncio.create_task(hold_idle(port, opened, idle_closes, i)) for i in range(1000)]
    tasks += [asyncio.create_task(hold_idle(port, opened, slow_closes, i, trickle=head)) for i in range(50)]
    tasks += [asyncio.create_task(unread_stream(port, unread)) for _ in range(20)]
    streams = [asyncio.create_task(stream(port, stream_outcomes)) for _ in range(1100)]
    peak_rss, peak_fds = 0.0, 0

    async def sample() -> None:
        nonlocal peak_rss, peak_fds
        while True:
            rss, fds = gateway_sample(pid)
            peak_rss, peak_fds = max(peak_rss, rss), max(peak_fds, fds)
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    # The loaded probes run in processes of their own, so that this process's loop (busy
    # with 2,000 connections) is not in their times; the same probe sent straight to the
    # upstream shows what of the probe's time is the upstream's own.
    probes = [probe_process(p, until=opened + args.load_seconds) for p in (port, upstream_port)]
    loaded, direct_loaded = (await asyncio.gather(*probes))
    await asyncio.wait(streams, timeout=max(5.0, 60 - (time.monotonic() - opened)))
    unread_closed = sum(closed_by_server(sock) for sock in unread)
    sampler.cancel()
    for task in [*tasks, *streams]:
        task.cancel()
    await asyncio.gather(*tasks, *streams, sampler, return_exceptions=True)
    for sock in unread:
        sock.close()
    limit = CLIENT_TIMEOUT_SECONDS + 2.0
    through, direct = summary(loaded, origin=opened), summary(direct_loaded, origin=opened)
    alone = summary(unloaded)
    return {
        "probe_unloaded": alone,
        "probe_upstream_direct_unloaded": summary(direct_unloaded),
        "probe_loaded": through,
        "probe_upstream_direct_loaded": direct,
        "latgate_added_p99_ms": {
            "over_direct_loaded": round(through["p99_ms"] - direct["p99_ms"], 1),
            "over_unloaded": round(through["p99_ms"] - alone["p99_ms"], 1),
        },
        "streams": stream_outcomes,
        "idle_closed_within_timeout": sum(1 for c in idle_closes if c is not None and c <= limit),
        "slowloris_closed_within_timeout": sum(1 for c in slow_closes if c is not None and c <= limit),
        "unread_streams_closed": unread_closed,
        "gateway_rss_mb_before_load": round(rss_before_load, 1),
        "gateway_peak_rss_mb": round(peak_rss, 1),
        "gateway_peak_fds": peak_fds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-seconds", type=float, default=25.0)
    parser.add_argument("--soft-nofile", type=int, default=1024, help="the gateway's soft RLIMIT_NOFILE at start")
    parser.add_argument("--baseline-src", help="run the gateway from this source tree (older code)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--big-bodies", action=argparse.BooleanOptionalAction, default=True, help="measure the big-body stall first (default on)")
    parser.add_argument("--probe", nargs=2, metavar=("PORT", "UNTIL"), help=argparse.SUPPRESS)
    parser.add_argument("--stream-gaps", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stream_gaps:  # the child of stream_gaps_process
        print(asyncio.run(stream_gaps(args.stream_gaps)))
        return 0
    if args.probe:  # the child of probe_process
        print(json.dumps(asyncio.run(probe(int(args.probe[0]), until=float(args.probe[1]), interval=0.2))))
        return 0
    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        print("abuse.py needs Linux and 2 cores", file=sys.stderr)
        return 2
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the clients need ~2,300 sockets
    healthy_port, bulk_port, port = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen] = []
    load = os.getloadavg()
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed at exit)  the gateway's stderr (a pipe could fill and block it)
    try:
        os.sched_setaffinity(0, {1})  # this process, its probes and the upstreams: core 1
        mock = str(Path(__file__).with_name("mock_upstream.py"))
        for up_port, command in (
            (healthy_port, [sys.executable, mock, *HEALTHY, str(healthy_port)]),
            (bulk_port, [sys.executable, "-m", "latgate", "sim", "--port", str(bulk_port), *BULK]),
        ):
            procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_ready(f"http://127.0.0.1:{up_port}/health", procs[-1])
        config = Path(tempfile.mkdtemp(prefix="latgate-abuse-")) / "config.toml"
        config.write_text(CONFIG.format(healthy=healthy_port, bulk=bulk_port) + ("" if args.baseline_src else LIMITS))
        env = dict(os.environ)
        if args.baseline_src:
            env["PYTHONPATH"] = args.baseline_src
        # the gateway inherits the soft limit it starts with; this process takes its own back
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(args.soft_nofile, hard), hard))
        gateway = subprocess.Popen(
            ["taskset", "-c", "0", *latgate_serve_command(config, port=port, log_level="warning")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        procs.append(gateway)
        wait_ready(f"http://127.0.0.1:{port}/healthz", gateway)
        figures = asyncio.run(big_bodies(port)) if args.big_bodies else {}
        figures["gateway_rss_mb_after_big_bodies"] = round(gateway_sample(gateway.pid)[0], 1)
        figures.update(asyncio.run(run_load(port, gateway.pid, args, upstream_port=healthy_port)))
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        figures["ejections"] = metric_sum(text, "latgate_ejections_total")
        figures["upstream_errors"] = metric_sum(text, "latgate_upstream_errors_total")
        figures["retries"] = metric_sum(text, "latgate_retries_total")
        figures["load_average_at_start"] = [round(x, 2) for x in load]
        figures["gateway"] = "baseline " + args.baseline_src if args.baseline_src else "this tree"
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
    log.seek(0)
    stderr = log.read()
    figures["gateway_tracebacks"] = stderr.count("Traceback")
    figures["gateway_log_lines"] = len(stderr.splitlines())
    log.close()
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
