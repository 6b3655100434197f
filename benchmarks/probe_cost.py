"""CPU time an idle latgate spends on active health probes, per probe: latgate with
``--providers`` providers of ``--endpoints`` endpoints each (one mock port per endpoint),
no traffic, so every endpoint is probed every ``--interval`` seconds.

    .venv/bin/python benchmarks/probe_cost.py [--providers 100] [--endpoints 4]
        [--interval 1] [--seconds 10] [--baseline-src PATH/TO/OTHER/src]

The gateway's CPU time (user + system, from ``/proc/PID/stat``) over ``--seconds`` after
a warm-up round, divided by the probes due in that time (endpoints x seconds /
interval). With ``--baseline-src`` the same is done for that tree (put first on
``PYTHONPATH``) in the same run and the ratio printed. A loaded machine inflates both
sides alike; compare the ratio.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import wait_port
from serving import free_port, latgate_serve_command

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far (seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15)


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1 (all held while chosen)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def measure(*, src: str | None, providers: int, endpoints: int, interval: float, seconds: float, workdir: Path) -> float:
    """CPU microseconds per probe of the latgate in ``src`` (None: this one)."""
    ports = free_ports(providers * endpoints)
    mock = subprocess.Popen([sys.executable, str(Path(__file__).with_name("mock_upstream.py")), *map(str, ports)])
    lines = [f"[health]\nprobe_interval_sec = {interval}\n"]
    for p in range(providers):
        chunk = ports[p * endpoints : (p + 1) * endpoints]
        urls = ", ".join(f'"http://127.0.0.1:{port}/v1"' for port in chunk)
        lines.append(f'[providers.p{p}]\nendpoints = [{urls}]\nmodels = ["m{p}"]\n')
    config = workdir / "probe-config.toml"
    config.write_text("".join(lines))
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    gw_port = free_port()
    gateway = subprocess.Popen(
        latgate_serve_command(config, port=gw_port, log_level="warning"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        for port in ports[:: max(1, len(ports) // 8)]:
            wait_port(port, timeout=30)
        wait_port(gw_port, timeout=60, proc=gateway)
        time.sleep(2 * interval)  # start-up done and the first probe rounds behind
        before = cpu_seconds(gateway.pid)
        time.sleep(seconds)
        used = cpu_seconds(gateway.pid) - before
    finally:
        gateway.terminate()
        mock.terminate()
        gateway.wait()
        mock.wait()
    probes = len(ports) * seconds / interval
    return used / probes * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", type=int, default=100)
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--interval", type=float, default=1.0, help="probe_interval_sec")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the CPU time is measured")
    parser.add_argument("--baseline-src", help="another latgate source tree (its src/ folder) to compare")
    args = parser.parse_args()
    shape = {"providers": args.providers, "endpoints": args.endpoints, "interval": args.interval, "seconds": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        this = measure(src=None, workdir=Path(tmp), **shape)
        print(f"latgate: {this:.0f} us of CPU per probe ({args.providers * args.endpoints} endpoints)")
        if args.baseline_src:
            base = measure(src=args.baseline_src, workdir=Path(tmp), **shape)
            print(f"baseline {args.baseline_src}: {base:.0f} us of CPU per probe; this / baseline = {this / base:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
