"""Issue 18 part 3: the per-event path of paced streams under each HTTP server latgate
could run on, against nginx and the upstream called directly, in one run.

    .venv/bin/python benchmarks/paced_servers.py [--servers uvicorn,granian-asgi,granian-rsgi,own] [--json OUT]

The cell is ``overhead.py``'s ``paced`` mode: ``--streams`` (1,000) connections, each
asking for a stream of 32 chunks 20 ms apart, one after another for ``--seconds``; each
gateway alone on core 0, the mock upstream and the load generator on core 1. Per
target: CPU per stream (user+system from ``/proc``), the inter-chunk gap p50/p99 and
what it adds over direct, and each latgate server's ratios to nginx (issue 18's
targets: CPU per stream <= 2x nginx's, added inter-chunk p99 <= 3x nginx's). The
servers are started by ``server_variants.py``; ``--rounds N`` repeats the whole set
interleaved (this machine's load moves CPU figures by a third between runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import write_json
from mock_upstream import PACED_CHUNKS
from overhead import measure
from peers import MODELS, Direct, Latgate, Nginx, free_port, wait_port

SERVERS = ("uvicorn", "granian-asgi", "granian-rsgi", "own")


class LatgateOn(Latgate):
    """latgate's app with the shipped defaults under one of :data:`SERVERS`."""

    start_timeout = 60.0

    def __init__(self, server: str) -> None:
        super().__init__(name=f"latgate-{server}")
        self.server = server

    def available(self) -> str | None:
        if self.server.startswith("granian") and importlib.util.find_spec("granian") is None:
            return "granian is not installed (pip install granian)"
        return None

    def command(self, *, port: int, upstream_port: int, workdir: Path) -> list[str]:
        models = ", ".join(f'"{m}"' for m in MODELS)
        config = workdir / "config.toml"
        config.write_text(f'[providers.up]\napi_base = "http://127.0.0.1:{upstream_port}/v1"\nmodels = [{models}]\n')
        script = Path(__file__).with_name("server_variants.py")
        return [sys.executable, str(script), self.server, str(config), str(port)]


def ratios(rows: list[dict]) -> list[dict]:
    """Each latgate server's CPU per stream and added inter-chunk p99 against nginx's."""
    out = []
    for r in rows:
        nginx = next((n for n in rows if n["target"] == "nginx" and n.get("round") == r.get("round")), None)
        if not r["target"].startswith("latgate") or nginx is None:
            continue
        cpu = r["cpu_us_per_request"] / nginx["cpu_us_per_request"] if r["cpu_us_per_request"] and nginx["cpu_us_per_request"] else None
        itl = r["added_itl_p99_ms"] / nginx["added_itl_p99_ms"] if nginx.get("added_itl_p99_ms") else None
        out.append({"target": r["target"], "round": r.get("round"), "cpu_x_nginx": cpu, "cpu_met": cpu is not None and cpu <= 2, "itl_p99_x_nginx": itl, "itl_met": itl is not None and itl <= 3})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--no-nginx", action="store_true")
    parser.add_argument("--rounds", type=int, default=1, help="run every target this many times, interleaved; the table shows each round")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    servers = [s for s in args.servers.split(",") if s]
    targets = ([] if args.no_nginx else [Nginx()]) + [LatgateOn(s) for s in servers]
    up_port = free_port()
    mock = subprocess.Popen(["taskset", "-c", "1", sys.executable, str(Path(__file__).with_name("mock_upstream.py")), str(up_port)])
    rows: list[dict] = []
    try:
        wait_port(up_port, timeout=10, proc=mock)
        direct = Direct()
        direct.port = up_port
        rows.append(measure(direct, "paced", args.streams, args.seconds))
        for round_ in range(1, args.rounds + 1):
            for target in targets:
                why = target.available()
                if why:
                    print(f"skipping {target.name}: {why}", file=sys.stderr)
                    continue
                target.start(upstream_port=up_port)
                try:
                    rows.append({**measure(target, "paced", args.streams, args.seconds), "round": round_})
                    print(f"  {target.name}: {rows[-1]['requests']} streams, {rows[-1]['errors']} errors", file=sys.stderr)
                finally:
                    target.stop()
    finally:
        mock.terminate()
        mock.wait(timeout=10)
    base = rows[0]
    for r in rows[1:]:
        r["added_itl_p99_ms"] = r["itl_p99_ms"] - base["itl_p99_ms"]
        r["added_p50_ms"] = r["p50_ms"] - base["p50_ms"]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.streams} paced streams of {PACED_CHUNKS} chunks")
    print(f"{'target':<22}{'round':>6}{'streams':>8}{'err':>5}{'us/stream':>11}{'itl p50':>9}{'itl p99':>9}{'+itl p99':>10}{'+p50':>8}{'rss MB':>8}")
    for r in rows:
        cpu = r["cpu_us_per_request"]
        print(
            f"{r['target']:<22}{r.get('round', '-'):>6}{r['requests']:>8}{r['errors']:>5}{(f'{cpu:.0f}' if cpu else '-'):>11}{r['itl_p50_ms']:>9.2f}{r['itl_p99_ms']:>9.2f}"
            f"{r.get('added_itl_p99_ms', 0):>10.2f}{r.get('added_p50_ms', 0):>8.2f}{(r['rss_mb'] or 0):>8.0f}"
        )
    checks = ratios(rows)
    for c in checks:
        print(f"  {c['target']} (round {c['round']}): CPU {c['cpu_x_nginx']:.2f}x nginx (target <= 2), added itl p99 {c['itl_p99_x_nginx']:.2f}x nginx (target <= 3)")
    if args.json:
        write_json(Path(args.json), {"command": " ".join(sys.argv), "load_average": os.getloadavg(), "rows": rows, "ratios": checks})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
