"""``latgate serve --workers N``: one supervisor process, N worker processes, one port.

The supervisor reserves the port (:func:`latgate.process.listen.reserve_port`: a taken port is
one line, before anything starts), then starts N workers with Python's ``spawn``
method, each listening on a socket of its own on that port with ``SO_REUSEPORT``: the
kernel spreads new connections evenly over them (one shared socket let whichever worker
woke first take most of them). A worker exits when its supervisor dies (the parent-death
signal, ``prctl(PR_SET_PDEATHSIG)``, delivers SIGTERM: it drains like any stop), so a
supervisor killed with ``kill -9`` leaves no worker serving unsupervised, and a restart
binds the port cleanly. Each worker is a complete
gateway (:func:`latgate.process.lifecycle.serve`) with its own routing state: endpoint choice by
fewest requests in flight and passive health are per worker, which stays sensible
because connections spread evenly over workers, so each sees a fair sample of each
endpoint's behaviour. ``/metrics`` on any worker reports all workers
(:mod:`latgate.foundation.metrics`, prometheus-client's multiprocess mode in
``$PROMETHEUS_MULTIPROC_DIR``, a temporary directory unless set).

Signals to the supervisor:

- SIGTERM / SIGINT: close its copy of the socket, send SIGTERM to every worker (each
  drains, see :mod:`latgate.process.lifecycle`), wait up to the drain timeout plus
  :data:`SHUTDOWN_GRACE_SECONDS`, then kill what is left. A second SIGINT kills at once.
- SIGHUP: validate the config file; if it is valid send SIGHUP to every worker (each
  reloads), else log why and leave them as they are. A worker answering
  ``POST /admin/reload`` reloads itself, then sends SIGHUP here so the others follow.

A worker that dies is replaced. One that could not start (status
:data:`STARTUP_FAILED`: the config file no longer loads, the app failed to start) or
died within :data:`MIN_UPTIME_SECONDS` of its start without serving is not started again at once (a
crash loop helps nobody): the others keep serving, and the next successful reload
starts it again. With no worker left the supervisor exits with status 1.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from latgate.foundation.config import ConfigError, load_config

log = logging.getLogger("latgate")

MULTIPROC_ENV_VAR = "PROMETHEUS_MULTIPROC_DIR"
SHUTDOWN_GRACE_SECONDS = 5.0
MIN_UPTIME_SECONDS = 1.0
STARTUP_FAILED = 3  # uvicorn's status for a failed start-up too
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs (pickled to it by ``spawn``)."""

    index: int
    host: str
    port: int
    config_path: str
    metrics_dir: str
    log_level: str
    log_format: str
    drain_timeout_seconds: float
    supervisor_pid: int
    pinned: frozenset[str] = frozenset()  # listen keys the command line set (ListenAddress)


def run_worker(spec: WorkerSpec, serving: Any = None) -> None:
    """A worker process's body: load the config, serve until SIGTERM. Exits with
    :data:`STARTUP_FAILED` when the config does not load.

    A SIGHUP that arrives while the worker starts is remembered and acted on once it
    serves (SIGHUP's default action would end the process).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor turns Ctrl-C into SIGTERM
    _exit_with_parent(spec.supervisor_pid)
    hangup_while_starting = threading.Event()
    signal.signal(signal.SIGHUP, lambda *_: hangup_while_starting.set())
    from latgate.foundation.logs import configure_logging

    configure_logging(level=spec.log_level, log_format=spec.log_format, show_pid=True)
    try:
        config = load_config(spec.config_path)
    except ConfigError as exc:
        log.error("worker %d: %s", spec.index, exc)
        raise SystemExit(STARTUP_FAILED) from None
    from latgate.app.asgi import create_app
    from latgate.app.reload import ListenAddress
    from latgate.process.lifecycle import serve
    from latgate.process.listen import ListenError, bind_socket

    try:
        sock = bind_socket(spec.host, spec.port, reuse_port=True)
    except ListenError as exc:
        log.error("worker %d: %s", spec.index, exc)
        raise SystemExit(STARTUP_FAILED) from None
    app = create_app(config, metrics_multiprocess_dir=spec.metrics_dir)
    reloader = app.state.reloader
    reloader.notify = lambda: os.kill(spec.supervisor_pid, signal.SIGHUP)
    reloader.listening = ListenAddress(host=spec.host, port=spec.port, pinned=spec.pinned)

    def started() -> None:
        log.info("worker %d (pid %d) serving", spec.index, os.getpid())
        if serving is not None:
            serving.set()  # the supervisor's sign that this worker started (not a crash loop)
        if hangup_while_starting.is_set():
            reloader.reload_logged()

    serve(
        app,
        sock=sock,
        reloader=app.state.reloader,
        log_level=spec.log_level,
        log_format=spec.log_format,
        drain_timeout_seconds=spec.drain_timeout_seconds,
        handle_sigint=False,
        on_started=started,
    )


PR_SET_PDEATHSIG = 1  # prctl(2)


def _exit_with_parent(supervisor_pid: int) -> None:
    """Ask the kernel for SIGTERM when the supervisor dies (Linux ``prctl``); exit now
    if it died already (the worker was re-parented before the request took effect)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != supervisor_pid:
        raise SystemExit(0)


class Supervisor:
    """Starts, replaces, reloads and stops the workers (see the module docstring).

    Args:
        sock: the port's reservation (:func:`~latgate.process.listen.reserve_port`); each
            worker listens on ``host`` and this socket's port itself.
        host: the address the workers listen on.
        config_path: the config file each worker loads (validated by the caller).
        workers: how many worker processes.
        log_level / log_format: the workers' logging.
        drain_timeout_seconds: each worker's drain timeout after SIGTERM.
        pinned: the listen keys the command line set (see
            :class:`latgate.app.reload.ListenAddress`).
    """

    def __init__(
        self,
        *,
        sock: socket.socket,
        host: str,
        config_path: str,
        workers: int,
        log_level: str,
        log_format: str,
        drain_timeout_seconds: float,
        pinned: frozenset[str] = frozenset(),
    ) -> None:
        self._sock = sock
        self._count = workers
        # every worker's spec but its index; the metrics directory is made by run()
        self._spec = WorkerSpec(
            index=0,
            host=host,
            port=sock.getsockname()[1],
            config_path=os.path.abspath(config_path),
            metrics_dir="",
            log_level=log_level,
            log_format=log_format,
            drain_timeout_seconds=drain_timeout_seconds,
            supervisor_pid=os.getpid(),
            pinned=pinned,
        )
        # spawn, not fork: a fresh interpreter per worker, nothing inherited but the
        # socket (and no fork server in between: the workers are this process's children).
        self._context = multiprocessing.get_context("spawn")
        self._procs: dict[int, multiprocessing.process.BaseProcess] = {}
        self._started_at: dict[int, float] = {}
        self._serving: dict[int, Any] = {}  # multiprocessing Events, set once a worker serves
        self._missing: set[int] = set()  # workers that could not start, until the next reload
        self._stopping = False
        self._deadline: float | None = None
        self._exit_code = 0

    def run(self) -> int:
        """Run until stopped; returns the exit code (0, or 1 when no worker could run)."""
        with _metrics_dir() as metrics_dir, _signal_pipe() as wakeup:
            self._spec = replace(self._spec, metrics_dir=metrics_dir)
            for index in range(self._count):
                self._start(index)
            while self._procs:
                timeout = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
                ready = wait([wakeup, *(p.sentinel for p in self._procs.values())], timeout)
                if wakeup in ready:
                    for signum in os.read(wakeup, 512):
                        self._on_signal(signum)
                self._reap()
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    self._kill_all("drain timeout passed")
        return self._exit_code

    def _start(self, index: int) -> None:
        spec = replace(self._spec, index=index)
        serving = self._serving[index] = self._context.Event()
        proc = self._context.Process(target=run_worker, args=(spec, serving), name=f"latgate-worker-{index}")
        proc.start()
        self._procs[index] = proc
        self._started_at[index] = time.monotonic()

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGHUP:
            self._reload()
        elif not self._stopping:
            self._stop(signal.Signals(signum).name)
        elif signum == signal.SIGINT:
            self._kill_all("second SIGINT")

    def _reload(self) -> None:
        if self._stopping:
            return
        try:
            load_config(self._spec.config_path)
        except ConfigError as exc:
            log.error("reload rejected, workers keep the previous config: %s", exc)
            return
        log.info("SIGHUP: reloading %d workers", len(self._procs))
        for proc in self._procs.values():
            _signal(proc, signal.SIGHUP)
        for index in sorted(self._missing):
            log.info("starting worker %d again", index)
            self._start(index)
        self._missing.clear()

    def _stop(self, reason: str) -> None:
        self._stopping = True
        self._sock.close()  # the workers stop listening as they drain; then connections are refused
        self._deadline = time.monotonic() + self._spec.drain_timeout_seconds + SHUTDOWN_GRACE_SECONDS
        log.info(
            "%s: stopping %d workers (drain timeout %gs)",
            reason,
            len(self._procs),
            self._spec.drain_timeout_seconds,
        )
        for proc in self._procs.values():
            _signal(proc, signal.SIGTERM)

    def _kill_all(self, reason: str) -> None:
        log.warning("%s: killing %d workers", reason, len(self._procs))
        for proc in self._procs.values():
            proc.kill()
        self._deadline = None

    def _reap(self) -> None:
        from prometheus_client import multiprocess

        for index, proc in list(self._procs.items()):
            if proc.exitcode is None:
                continue
            proc.join()
            del self._procs[index]
            multiprocess.mark_process_dead(proc.pid, self._spec.metrics_dir)
            if self._stopping:
                continue
            uptime = time.monotonic() - self._started_at[index]
            never_served = not self._serving[index].is_set()
            if proc.exitcode == STARTUP_FAILED or (never_served and uptime < MIN_UPTIME_SECONDS):
                self._missing.add(index)
                log.error(
                    "worker %d could not start (status %s); %d workers serve until a reload (SIGHUP) succeeds",
                    index,
                    proc.exitcode,
                    len(self._procs),
                )
                if not self._procs:
                    self._exit_code = 1
                continue
            log.warning(
                "worker %d (pid %d) exited with status %s; starting another", index, proc.pid, proc.exitcode
            )
            self._start(index)


def _signal(proc: multiprocessing.process.BaseProcess, signum: int) -> None:
    if proc.pid is not None and proc.exitcode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signum)


@contextlib.contextmanager
def _metrics_dir() -> Iterator[str]:
    """``$PROMETHEUS_MULTIPROC_DIR`` emptied of old files, else a temporary directory
    (removed at exit); exported so the spawned workers see it before they import
    prometheus_client."""
    given = os.environ.get(MULTIPROC_ENV_VAR)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
        yield str(path)
        return
    path = Path(tempfile.mkdtemp(prefix="latgate-metrics-"))
    os.environ[MULTIPROC_ENV_VAR] = str(path)
    try:
        yield str(path)
    finally:
        os.environ.pop(MULTIPROC_ENV_VAR, None)
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _signal_pipe() -> Iterator[int]:
    """A pipe the C-level signal handler writes each signal's number to, so the main
    loop's ``wait`` wakes on a signal as on a worker's exit (no polling)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in _SIGNALS}
    try:
        yield read_fd
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(read_fd)
        os.close(write_fd)
