"""The systems the overhead benchmark puts in front of the mock upstream: latgate and,
when installed (``benchmarks/setup_peers.sh``), nginx, vllm-router and LiteLLM proxy.

Each :class:`Target` starts pinned to the gateway core(s) (``taskset``), serves
``/v1/chat/completions`` for the models ``bench`` and ``bench-paced`` on a loopback port,
and exposes the pids of its process tree (for CPU and RSS from ``/proc``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from serving import free_port, latgate_serve_command

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".peers"
MODELS = ("bench", "bench-paced")


def wait_port(port: int, *, timeout: float, proc: subprocess.Popen | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of ``pids`` (threads included)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def rss_mb(pids: list[int]) -> float:
    """Resident memory of ``pids``, summed (MB)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class Target:
    """One system under test. ``command(port, upstream_port, workdir)`` builds its
    command line; ``None`` from :meth:`available` means it can run."""

    name = ""
    start_timeout = 30.0
    warm_seconds = 0.3

    def __init__(self, *, cores: str = "0") -> None:
        self.cores = cores
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._pids: list[int] = []

    def available(self) -> str | None:
        """Why the target cannot run here, or ``None``."""
        return None

    def command(self, *, port: int, upstream_port: int, workdir: Path) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self, *, upstream_port: int) -> None:
        self.port = free_port()
        workdir = Path(tempfile.mkdtemp(prefix=f"overhead-{self.name}-"))
        cmd = [
            "taskset",
            "-c",
            self.cores,
            *self.command(port=self.port, upstream_port=upstream_port, workdir=workdir),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / "stderr.log", "wb"),  # noqa: SIM115 (kept for the process's life)
            env=self.env(),
            cwd=workdir,
            start_new_session=True,
        )
        try:
            wait_port(self.port, timeout=self.start_timeout, proc=self.proc)
        except RuntimeError as exc:
            tail = (workdir / "stderr.log").read_text(errors="replace")[-400:]
            self.stop()
            raise RuntimeError(f"{self.name}: {exc}; stderr: {tail!r}") from None
        time.sleep(1.0)  # let workers spawn and settle
        self._pids = tree(self.proc.pid)

    def pids(self) -> list[int]:
        return self._pids

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Direct(Target):
    """The mock upstream itself (nothing in between)."""

    name = "direct"


class Latgate(Target):
    """``latgate serve`` with the shipped defaults (routing, metrics, access log at INFO).

    ``providers`` > 0: that many providers of ``len(upstream_ports)`` endpoints each
    (one per mock port), the benchmark's models served by the last one only (each other
    provider serves a model of its own), instead of one provider with one ``api_base``;
    active health probes are off there (``probe_interval_sec = 0``: 400 idle endpoints
    probed every 5 s would be measured instead of routing).
    ``limits``: ``[auth]`` with one key (the load generator's ``sk-bench``) whose RPM and
    TPM limits are on but never reached; ``redis_url``: ``[state] redis_url``.
    """

    name = "latgate"

    def __init__(
        self,
        *,
        cores: str = "0",
        workers: int = 1,
        name: str = "latgate",
        providers: int = 0,
        limits: bool = False,
        redis_url: str | None = None,
    ) -> None:
        super().__init__(cores=cores)
        self.workers = workers
        self.name = name
        self.providers = providers
        self.limits = limits
        self.redis_url = redis_url
        self.upstream_ports: list[int] = []
        if workers > 1:
            self.name = f"{self.name}-w{workers}"

    def config_text(self, upstream_port: int) -> str:
        """The ``config.toml`` this target runs with."""
        models = ", ".join(f'"{m}"' for m in MODELS)
        if not self.providers:
            text = f'[providers.up]\napi_base = "http://127.0.0.1:{upstream_port}/v1"\nmodels = [{models}]\n'
        else:
            ports = self.upstream_ports or [upstream_port]
            endpoints = ", ".join(f'"http://127.0.0.1:{port}/v1"' for port in ports)
            text = ""
            for i in range(self.providers):
                served = models if i == self.providers - 1 else f'"other-{i}"'
                text += f"[providers.p{i}]\nendpoints = [{endpoints}]\nmodels = [{served}]\n\n"
            text += "[health]\nprobe_interval_sec = 0\n\n"
        if self.limits:
            text += '[[auth.keys]]\nname = "bench"\nkey = "sk-bench"\nrpm = 100000000\ntpm = 1000000000000\n\n'
        if self.redis_url:
            text += f'[state]\nredis_url = "{self.redis_url}"\n'
        return text

    def command(self, *, port: int, upstream_port: int, workdir: Path) -> list[str]:
        (workdir / "config.toml").write_text(self.config_text(upstream_port))
        cmd = latgate_serve_command(workdir / "config.toml", port=port)
        return cmd + (["--workers", str(self.workers)] if self.workers > 1 else [])


class Redis:
    """A throw-away ``redis-server`` on loopback (no persistence), pinned to ``cores``."""

    def __init__(self, *, cores: str = "1") -> None:
        self.cores = cores
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def available() -> str | None:
        return None if shutil.which("redis-server") else "redis-server not installed"

    def start(self) -> str:
        """Start it; returns its ``redis://`` URL."""
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["taskset", "-c", self.cores, "redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
             "--save", "", "--appendonly", "no", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_port(self.port, timeout=10, proc=self.proc)
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class Nginx(Target):
    """nginx 1 worker as a plain reverse proxy: upstream keep-alive, no buffering (SSE)."""

    name = "nginx"

    def available(self) -> str | None:
        return None if shutil.which("nginx") or Path("/usr/sbin/nginx").exists() else "nginx not installed"

    def command(self, *, port: int, upstream_port: int, workdir: Path) -> list[str]:
        (workdir / "nginx.conf").write_text(
            f"""worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {workdir};
  proxy_temp_path {workdir};
  upstream up {{ server 127.0.0.1:{upstream_port}; keepalive 1024; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""
        )
        return [
            shutil.which("nginx") or "/usr/sbin/nginx",
            "-p",
            str(workdir),
            "-c",
            str(workdir / "nginx.conf"),
        ]


class VllmRouter(Target):
    """vllm-router (Rust) with the mock as its only worker."""

    name = "vllm-router"
    binary = PEERS / "vllm-router" / "bin" / "vllm-router"

    def available(self) -> str | None:
        return None if self.binary.exists() else "not installed (benchmarks/setup_peers.sh)"

    def command(self, *, port: int, upstream_port: int, workdir: Path) -> list[str]:
        return [
            str(self.binary),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--worker-urls", f"http://127.0.0.1:{upstream_port}",
        ]  # fmt: skip


class LiteLLM(Target):
    """LiteLLM proxy, lightest set-up: one worker, no database, no callbacks."""

    name = "litellm"
    start_timeout = 120.0
    binary = PEERS / "litellm" / "bin" / "litellm"

    def available(self) -> str | None:
        return None if self.binary.exists() else "not installed (benchmarks/setup_peers.sh)"

    def command(self, *, port: int, upstream_port: int, workdir: Path) -> list[str]:
        entries = "".join(
            f"  - model_name: {m}\n    litellm_params:\n      model: openai/{m}\n"
            f"      api_base: http://127.0.0.1:{upstream_port}/v1\n      api_key: sk-bench\n"
            for m in MODELS
        )
        (workdir / "config.yaml").write_text(
            "model_list:\n" + entries + "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
            "general_settings:\n  disable_spend_logs: true\n"
        )
        return [
            str(self.binary),
            "--config",
            str(workdir / "config.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ]

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # never fetch the cost map from the network
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",  # no key: the lightest set-up
        }
