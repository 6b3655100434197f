"""Reloading the config while serving: SIGHUP and ``POST /admin/reload``.

A reload reads the config file the gateway was started with, validates it completely,
builds a new :class:`~latgate.request.gateway.Gateway` from it, and only then swaps it into
``app.state.gateway`` (one attribute assignment: atomic for the event loop). Requests
already in flight keep the ``Gateway`` they started with and finish on the old config;
new requests get the new one. An invalid file changes nothing: its errors (every
mistake, each with file, line, key and fix) are returned or logged, and the old
config keeps serving. A valid file's warnings are logged as ``serve`` logs them at start
(:func:`~latgate.routing.warnings.startup_warnings`: an ``api_key_env`` naming an unset
variable, its name only, and so on); like at start they do not stop it.

What carries over: the metrics (counters keep counting, so ``rate()`` stays continuous),
the pooled upstream client when the ``[defaults]`` timeouts are unchanged, the
rate-limit state, and the live state of every endpoint whose provider keeps its name,
connector, engine and role and whose URL is unchanged (TTFT and ITL fits, counters,
in-flight counts, circuit state: :func:`~latgate.live.providers.carry.carry_live_state`).
What starts afresh: the live numbers of endpoints that are new, moved to another URL,
or whose provider changed connector, engine or role. What needs a restart: the listen address (``[server] host``/``port``): a reload whose file
names another address than the one the process listens on (:class:`ListenAddress`, not
the previous file: a change reloaded back is no change) says so and keeps listening
where it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from latgate.api.body import error_response
from latgate.foundation.config import ConfigError, load_config
from latgate.foundation.config.schema import Config, ServerConfig
from latgate.foundation.errors import InvalidRequest
from latgate.foundation.retired import KeptAcrossReloads
from latgate.request.gateway import Gateway, request_id
from latgate.routing.warnings import startup_warnings
from latgate.transport.upstream import UpstreamClient, UpstreamTransport

log = logging.getLogger("latgate")


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What a successful reload changed.

    Attributes:
        source: the config file read.
        providers: provider names now configured.
        added / removed: providers that appeared / disappeared.
        restart_needed: keys whose value in the file is not what the process runs
            with, and applies only after a restart (see :class:`ListenAddress`).
    """

    source: str
    providers: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    restart_needed: tuple[str, ...]

    def summary(self) -> str:
        """One log line's worth."""
        parts = [f"reloaded {self.source}: providers {', '.join(self.providers)}"]
        if self.added:
            parts.append(f"added {', '.join(self.added)}")
        if self.removed:
            parts.append(f"removed {', '.join(self.removed)}")
        if self.restart_needed:
            parts.append(f"{', '.join(self.restart_needed)} changed: applies after a restart")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": "reloaded",
            "config": self.source,
            "providers": list(self.providers),
            "added": list(self.added),
            "removed": list(self.removed),
            "restart_needed": list(self.restart_needed),
        }


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """Where this process listens, which a reloaded ``[server]`` is compared with.

    Attributes:
        host: the address listened on.
        port: the port listened on (the one the kernel chose when 0 was asked for).
        pinned: the keys the command line set (``"host"`` for ``--host``, ``"port"``
            for ``--port``): a restart with the same command keeps them, so the file's
            value of those never needs one.
    """

    host: str
    port: int
    pinned: frozenset[str] = frozenset()

    def restart_needed(self, server: ServerConfig) -> tuple[str, ...]:
        """The keys (``server.host``, ``server.port``) whose value in ``server`` is not
        where this process listens. ``port = 0`` (any free port) is met by any port."""
        moved = []
        if "host" not in self.pinned and server.host != self.host:
            moved.append("server.host")
        if "port" not in self.pinned and server.port not in (0, self.port):
            moved.append("server.port")
        return tuple(moved)


class UpstreamClients:
    """The upstream client of the current config, and those retired by reloads.

    A reload that keeps the ``[defaults]`` connect and read timeouts keeps the client
    (and its warm connection pool); one that changes them gets a new client. A retired
    client may still carry requests of the old config, so it is closed only by
    :meth:`aclose` when the app shuts down.

    Args:
        transport: carries every client's requests instead of latgate's own pool
            (tests: an in-memory :class:`~latgate.transport.upstream.UpstreamTransport`).
    """

    def __init__(self, *, transport: UpstreamTransport | None = None) -> None:
        self._clients: KeptAcrossReloads[tuple[float, float], UpstreamClient] = KeptAcrossReloads(
            make=lambda timeouts: UpstreamClient(
                connect_timeout_seconds=timeouts[0], read_timeout_seconds=timeouts[1], transport=transport
            ),
            on_retire=UpstreamClient.retire,
        )

    def client_for(self, config: Config) -> UpstreamClient:
        """The client to use for ``config``."""
        return self._clients.get((config.defaults.connect_timeout_sec, config.defaults.timeout_sec))

    async def aclose(self) -> None:
        """Close every client (app shutdown)."""
        await self._clients.aclose()


class Reloader:
    """Swaps a new :class:`Gateway` into ``state.gateway`` from the config file.

    Args:
        state: the app's state; ``state.gateway`` is read and replaced.
        build_gateway: builds everything derived from a config (``create_app``'s),
            carrying the live state of the gateway it replaces (its second argument).
        env: variables for ``${VAR}`` expansion (``os.environ`` by default).
        notify: called after a reload requested over HTTP succeeded (a worker tells its
            supervisor, which reloads the other workers).

    :attr:`listening` is where the process listens: by default the address of the config
    it was built with; the server sets the one it bound (and the keys its command line
    set) before serving.
    """

    def __init__(
        self,
        *,
        state: Any,
        build_gateway: Callable[[Config, Gateway | None], Gateway],
        env: Mapping[str, str] | None = None,
        notify: Callable[[], None] | None = None,
    ) -> None:
        self._state = state
        self._build = build_gateway
        self._env = env
        self.notify = notify
        server = state.gateway.config.server
        self.listening = ListenAddress(host=server.host, port=server.port)

    def reload(self) -> ReloadResult:
        """Re-read the config file the current gateway was loaded from and swap it in.

        Raises:
            ConfigError: the file is missing or invalid; nothing changed.
        """
        old: Gateway = self._state.gateway
        config = load_config(old.config.source, env=self._env)
        gateway = self._build(config, old)
        self._state.gateway = gateway
        result = _compare(old.config, config, self.listening)
        log.info(result.summary())
        for warning in startup_warnings(config, self._env):  # what serve logs at start (an unset api_key_env...)
            log.warning(warning)
        return result

    def reload_logged(self) -> bool:
        """:meth:`reload`, reporting the outcome in the log only (SIGHUP). True on success."""
        try:
            self.reload()
        except ConfigError as exc:
            log.error("reload rejected, still serving the previous config: %s", exc)
            return False
        return True


async def reload_endpoint(request: Request) -> Response:
    """``POST /admin/reload``: reload the config file.

    200 with ``{"status": "reloaded", "config", "providers", "added", "removed",
    "restart_needed"}``; 400 in the OpenAI error envelope when the file is invalid, the
    old config serving on: code ``invalid_config``, the config error's lines as
    ``message``, and every mistake of the file in ``error.errors`` as ``{"file", "line",
    "column", "key", "message", "fix"}`` (see :meth:`ConfigError.as_dicts`). Like every
    ``/admin/*`` route, it needs an admin key when ``[auth]`` is on.
    """
    reloader: Reloader = request.app.state.reloader
    try:
        result = reloader.reload()
    except ConfigError as exc:
        log.error("reload rejected, still serving the previous config: %s", exc)
        error = ConfigRejected(exc)
        return error_response(error, request_id=request_id(request.headers.get("x-request-id")))
    if reloader.notify is not None:
        reloader.notify()
    return Response(orjson.dumps(result.as_dict()), media_type="application/json")


class ConfigRejected(InvalidRequest):
    """400 ``invalid_config``: a reload's config file has mistakes, listed in
    ``error.errors`` beside the message."""

    code = "invalid_config"

    def __init__(self, error: ConfigError) -> None:
        super().__init__(f"config rejected, still serving the previous one: {error}")
        self.errors = error.as_dicts()

    def envelope(self) -> dict[str, dict[str, object]]:
        envelope = super().envelope()
        envelope["error"]["errors"] = self.errors
        return envelope


def _compare(old: Config, new: Config, listening: ListenAddress) -> ReloadResult:
    return ReloadResult(
        source=new.source,
        providers=tuple(new.providers),
        added=tuple(name for name in new.providers if name not in old.providers),
        removed=tuple(name for name in old.providers if name not in new.providers),
        restart_needed=listening.restart_needed(new.server),
    )
