"""Gateway overhead on loopback: latgate versus the upstream called directly, in one run.

    .venv/bin/python benchmarks/overhead.py [--quick] [--json OUT]

Set-up (2 cores): the gateway (`latgate serve`, shipped defaults: routing, metrics,
access log at INFO) runs alone on core 0; a zero-delay mock upstream and the load
generator share core 1. Modes: non-streamed answers, and 64-chunk SSE streams (each
chunk its own write, so the gateway sees them as separate reads). For each mode and
concurrency it reports requests/s, p50/p99 latency and time to first chunk, directly
and through latgate, the added milliseconds, and the gateway's CPU per request and per
streamed chunk (from /proc/PID/stat, so everything the process did is counted).
Speed is reported as measured in this one run; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
CHUNKS = 64
CHUNK = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n'
)
ROLE = b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
USAGE = b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":64,"total_tokens":72}}\n\n'
DONE = b"data: [DONE]\n\n"
JSON_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello " * 64}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 64, "total_tokens": 72},
    }
).encode()


# -- the mock upstream: raw asyncio HTTP/1.1, keep-alive, as cheap as it gets --------------


class _Upstream(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            if b'"stream":true' in body.replace(b" ", b""):
                asyncio.get_running_loop().create_task(self._stream())
            else:
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(JSON_BODY), JSON_BODY)
                )

    async def _stream(self):
        w = self.transport.write
        w(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in [ROLE] + [CHUNK] * CHUNKS + [USAGE, DONE]:
            w(b"%x\r\n%s\r\n" % (len(piece), piece))
            await asyncio.sleep(0)  # one write per event, as an engine flushing per token
        w(b"0\r\n\r\n")


def run_mock_upstream(port: int) -> None:
    async def main():
        server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port, backlog=1024)
        await server.serve_forever()

    asyncio.run(main())


# -- helpers ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_port(port: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


async def load(url: str, *, stream: bool, n: int, c: int) -> dict:
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": stream}).encode()
    lat, ttfc = [], []
    queue = list(range(n))
    connector = aiohttp.TCPConnector(limit=c)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker():
            while queue:
                queue.pop()
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
                    first = None
                    async for _ in r.content.iter_any():
                        if first is None:
                            first = time.perf_counter()
                    end = time.perf_counter()
                    assert r.status == 200, r.status
                lat.append((end - t0) * 1000)
                ttfc.append(((first or end) - t0) * 1000)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        elapsed = time.perf_counter() - start
    return {"rps": n / elapsed, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "ttfc_p50_ms": pct(ttfc, 50)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (about a minute)")
    parser.add_argument("--json", help="write results to this file")
    parser.add_argument(
        "--transport",
        choices=["aiohttp", "httpx"],
        default="aiohttp",
        help="latgate's upstream transport: aiohttp (shipped) or httpx's default, for comparison",
    )
    parser.add_argument("--mock-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mock_upstream:
        run_mock_upstream(args.mock_upstream)
        return 0
    pin = ["taskset", "-c"] if shutil.which("taskset") else None
    os.sched_setaffinity(0, {1})
    up_port, gw_port = free_port(), free_port()
    procs = []
    try:
        up_cmd = [sys.executable, __file__, "--mock-upstream", str(up_port)]
        procs.append(subprocess.Popen((pin + ["1"] if pin else []) + up_cmd))
        cfg = Path(tempfile.mkdtemp()) / "config.toml"
        cfg.write_text(f'[providers.up]\napi_base = "http://127.0.0.1:{up_port}/v1"\nmodels = ["bench"]\n')
        gw_cmd = [sys.executable, "-m", "latgate", "serve", "--config", str(cfg), "--port", str(gw_port)]
        env = {**os.environ, "LATGATE_UPSTREAM_TRANSPORT": args.transport}
        gw = subprocess.Popen((pin + ["0"] if pin else []) + gw_cmd, stderr=subprocess.DEVNULL, env=env)
        procs.append(gw)
        wait_port(up_port)
        wait_port(gw_port)
        time.sleep(0.5)
        idle_rss = rss_mb(gw.pid)
        scale = 0.25 if args.quick else 1.0
        plan = [("non-stream", False, 1, 1000), ("non-stream", False, 16, 4000), ("stream-64", True, 1, 300), ("stream-64", True, 16, 1500)]
        rows = []
        for mode, stream, c, n in plan:
            n = max(50, int(n * scale))
            direct = asyncio.run(load(f"http://127.0.0.1:{up_port}/v1/chat/completions", stream=stream, n=n, c=c))
            asyncio.run(load(f"http://127.0.0.1:{gw_port}/v1/chat/completions", stream=stream, n=min(n, 100), c=c))  # warm
            cpu0 = cpu_seconds(gw.pid)
            via = asyncio.run(load(f"http://127.0.0.1:{gw_port}/v1/chat/completions", stream=stream, n=n, c=c))
            cpu_us = (cpu_seconds(gw.pid) - cpu0) / n * 1e6
            rows.append(
                {
                    "mode": mode,
                    "concurrency": c,
                    "requests": n,
                    "direct": direct,
                    "latgate": via,
                    "added_p50_ms": via["p50_ms"] - direct["p50_ms"],
                    "added_p99_ms": via["p99_ms"] - direct["p99_ms"],
                    "added_ttfc_p50_ms": via["ttfc_p50_ms"] - direct["ttfc_p50_ms"],
                    "cpu_us_per_request": cpu_us,
                    "rss_mb": rss_mb(gw.pid),
                }
            )
        base = {r["concurrency"]: r["cpu_us_per_request"] for r in rows if r["mode"] == "non-stream"}
        for r in rows:
            if r["mode"] == "stream-64":
                r["cpu_us_per_chunk"] = (r["cpu_us_per_request"] - base[r["concurrency"]]) / CHUNKS
        print(f"latgate upstream transport: {args.transport}; gateway idle RSS {idle_rss:.1f} MB")
        print(f"{'mode':<11}{'c':>4}{'rps direct':>12}{'rps latgate':>13}{'+p50 ms':>9}{'+p99 ms':>9}{'+ttfc ms':>10}{'cpu us/req':>12}{'cpu us/chunk':>14}{'rss MB':>8}")
        for r in rows:
            chunk = f"{r['cpu_us_per_chunk']:.1f}" if "cpu_us_per_chunk" in r else "-"
            print(
                f"{r['mode']:<11}{r['concurrency']:>4}{r['direct']['rps']:>12.0f}{r['latgate']['rps']:>13.0f}"
                f"{r['added_p50_ms']:>9.2f}{r['added_p99_ms']:>9.2f}{r['added_ttfc_p50_ms']:>10.2f}"
                f"{r['cpu_us_per_request']:>12.0f}{chunk:>14}{r['rss_mb']:>8.1f}"
            )
        if args.json:
            Path(args.json).write_text(json.dumps({"idle_rss_mb": idle_rss, "rows": rows}, indent=2))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
