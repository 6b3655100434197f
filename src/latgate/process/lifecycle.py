"""The serving process's life: start on a bound socket, reload on SIGHUP, drain on SIGTERM.

:class:`GatewayServer` is uvicorn's server with latgate's signal handling:

- **SIGTERM** (and SIGINT, Ctrl-C): stop accepting at once (the listening socket is
  closed, so new connections are refused and a load balancer moves on), let requests in
  flight finish, streams included, for up to ``drain_timeout_seconds``, then cancel
  what is left, close the upstream client and exit 0. A second SIGINT exits at once.
- **SIGHUP**: reload the config file (:mod:`latgate.app.reload`); serving goes on either way.

Every step is a log line (``draining: ...``, ``drained in ...``), which is also how tests
follow it. Signals are taken on the event loop (``loop.add_signal_handler``), so they are
acted on immediately, not at uvicorn's next 0.1 s tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from latgate.api.routes import envelope_at
from latgate.app.httplimits import MAX_HEAD_BYTES, ClientLimits, ErrorAnswer, client_protocol
from latgate.app.reload import Reloader
from latgate.forwarding.exchange import DRAIN_CUT
from latgate.foundation.errors import InvalidRequest
from latgate.process.gcpolicy import settle_heap
from latgate.process.listen import default_max_connections
from latgate.process.starts import ASGIApp, StartGate

log = logging.getLogger("latgate")
#: header fields :func:`~latgate.app.httplimits.envelope` writes itself
_FRAMING = (b"content-type", b"content-length", b"connection")
#: after the drain timeout, how long requests cut may take to write their error ending
CUT_GRACE_SECONDS = 1.0


def client_limits(app: object) -> ClientLimits:
    """The client connection limits of ``app``'s ``[server]`` section (timeouts of 0
    are off; no ``max_connections``: :func:`~latgate.process.listen.default_max_connections` of
    the current soft descriptor limit). Refusals are recorded by the app's current
    gateway. An app that is not latgate's gets no limits."""
    state = getattr(app, "state", None)
    gateway = getattr(state, "gateway", None)
    if state is None or gateway is None:
        return ClientLimits()
    server = gateway.config.server
    cap = server.max_connections or default_max_connections(resource.getrlimit(resource.RLIMIT_NOFILE)[0])

    def on_refused(status: int, kind: str, path: str) -> str:
        return state.gateway.record_refusal(status=status, kind=kind, path=path)

    def error_body(path: str, status: int, message: str, code: str, request_id: str) -> ErrorAnswer:
        error = InvalidRequest(message, status=status, code=code)
        answer = envelope_at(path).render(error, request_id=request_id)
        headers = [(name, value) for name, value in answer.raw_headers if name not in _FRAMING]
        return bytes(answer.body), headers

    return ClientLimits(
        error_body=error_body,
        header_timeout_sec=server.header_timeout_sec or None,
        body_timeout_sec=server.body_timeout_sec or None,
        send_timeout_sec=server.send_timeout_sec or None,
        max_connections=cap,
        on_refused=on_refused,
    )


def uvicorn_config(
    app: ASGIApp,
    *,
    log_level: str,
    log_format: str,
    drain_timeout_seconds: float,
) -> uvicorn.Config:
    """The uvicorn settings latgate serves with (uvloop and httptools when installed),
    with ``app``'s client limits (:func:`client_limits`) and its requests begun at most
    a few per loop turn, newest first in a burst (:class:`~latgate.process.starts.StartGate`).

    ``log_format`` ``json`` routes uvicorn's own records through latgate's JSON
    formatter (:mod:`latgate.foundation.logs`) instead of uvicorn's text handlers.
    """
    return uvicorn.Config(
        StartGate(app),
        log_level="warning" if log_level == "info" else log_level,
        access_log=False,
        loop="auto",
        http=client_protocol(client_limits(app)),  # httptools, with heads, timeouts and a cap bounded
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        lifespan="on",
        timeout_keep_alive=75,
        # GatewayServer cuts at the drain timeout itself; uvicorn's own cut comes later
        # (whole seconds: the type uvicorn declares)
        timeout_graceful_shutdown=math.ceil(drain_timeout_seconds + CUT_GRACE_SECONDS + 1.0),
        server_header=False,
        proxy_headers=False,  # latgate reads no client address; skips a middleware per request
        log_config=None if log_format == "json" else LOGGING_CONFIG,
    )


def reload_on_sighup(reloader: Reloader) -> None:
    """What SIGHUP does to a serving gateway (``serve`` and ``demo``): log it, then
    reload the config file (:meth:`Reloader.reload_logged`); serving goes on either way."""
    log.info("SIGHUP: reloading the config")
    reloader.reload_logged()


class GatewayServer(uvicorn.Server):
    """uvicorn's ``Server`` with SIGTERM drain and SIGHUP reload (see the module docstring).

    Args:
        config: from :func:`uvicorn_config`.
        reloader: what SIGHUP calls; ``None`` ignores SIGHUP.
        drain_timeout_seconds: longest wait for requests in flight after SIGTERM.
        handle_sigint: False in a worker process: Ctrl-C reaches the whole process group
            and the supervisor turns it into one SIGTERM per worker.
        on_started: called once the socket is served and the signal handlers are in place.

    Unlike uvicorn's, a stop by signal exits the process normally (status 0) instead of
    re-raising the signal.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        reloader: Reloader | None,
        drain_timeout_seconds: float,
        handle_sigint: bool = True,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self._reloader = reloader
        self._drain_timeout_seconds = drain_timeout_seconds
        self._handle_sigint = handle_sigint
        self._on_started = on_started
        self._sockets: list[socket.socket] = []
        self._drain_started: float | None = None
        self._cut = 0

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._sockets = list(sockets or [])
        await super().serve(sockets=sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._on_started is not None:
            self._on_started()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        handled = [signal.SIGTERM, signal.SIGHUP]
        if self._handle_sigint:
            handled.append(signal.SIGINT)
        else:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in handled:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if sig == signal.SIGHUP:
            if self._reloader is not None and not self.should_exit:
                reload_on_sighup(self._reloader)
            return
        if self.should_exit:
            if sig == signal.SIGINT:
                log.warning("%s again: exiting without waiting for requests in flight", name)
                self.force_exit = True
            return
        self.should_exit = True
        self._drain_started = time.monotonic()
        self._stop_accepting()
        log.info(
            "draining: %s received, stopped accepting; %d connection(s) open, waiting up to %gs for requests in flight",
            name,
            len(self.server_state.connections),
            self._drain_timeout_seconds,
        )

    def _stop_accepting(self) -> None:
        """Close the listening sockets now (uvicorn would at its next tick). Before start-up
        completed there is nothing to close: uvicorn then skips serving altogether."""
        if not self.started:
            return
        for server in getattr(self, "servers", []):
            server.close()
        for sock in self._sockets:
            sock.close()

    async def _wait_tasks_to_complete(self) -> None:
        # uvicorn's wait for connections and requests to finish (called by its
        # shutdown), bounded by the drain timeout; then what is left is cancelled with
        # DRAIN_CUT, so each request ends with an error of its own (an error event on a
        # stream, a 503 envelope before the answer), and given CUT_GRACE_SECONDS to write it.
        try:
            await asyncio.wait_for(super()._wait_tasks_to_complete(), self._drain_timeout_seconds)
        except TimeoutError:
            tasks = list(self.server_state.tasks)
            for task in tasks:
                task.cancel(msg=DRAIN_CUT)
            if tasks:
                await asyncio.wait(tasks, timeout=CUT_GRACE_SECONDS)
            self._cut = len(tasks)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets=sockets)
        if self._drain_started is None:
            return
        elapsed = time.monotonic() - self._drain_started
        if elapsed >= self._drain_timeout_seconds:
            log.warning(
                "drain timeout (%gs) reached: %d request(s) still in flight were cut; exiting",
                self._drain_timeout_seconds,
                self._cut,
            )
        else:
            log.info("drained in %.2fs; exiting", elapsed)


def serve(
    app: ASGIApp,
    *,
    sock: socket.socket,
    reloader: Reloader | None,
    log_level: str,
    log_format: str,
    drain_timeout_seconds: float,
    handle_sigint: bool = True,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` on the listening ``sock`` until SIGTERM/SIGINT (blocking); the
    keyword arguments are :func:`uvicorn_config`'s and :class:`GatewayServer`'s."""
    settle_heap()  # latgate.process.gcpolicy: the app as built leaves the collector's view
    config = uvicorn_config(
        app, log_level=log_level, log_format=log_format, drain_timeout_seconds=drain_timeout_seconds
    )
    server = GatewayServer(
        config,
        reloader=reloader,
        drain_timeout_seconds=drain_timeout_seconds,
        handle_sigint=handle_sigint,
        on_started=on_started,
    )
    server.run(sockets=[sock])
