"""Where each coding-agent session was served last (session key -> endpoint id), kept in
process or shared by every gateway replica through Redis, so a session stays on the
engine that holds its prefix whichever latgate replica a load balancer sends it to.

Both maps answer ``get`` and ``put`` synchronously from a local bounded table (LRU, a
time to live), with no I/O on the request path. Only placements are kept: session keys
(64-bit numbers, already hashed from what the client sent) and endpoint ids, never a
prompt.

:class:`RedisSessionMap` adds, off the request path:

- **write-behind**: a placement that changed (or was last written more than a quarter
  of the TTL ago) is queued and written within ``flush_delay_seconds`` together with
  every other queued one: one ``EVALSHA`` per flush, which ``SET``s each
  ``latgate:{sessions}:KEY`` (the session key in 16 hex digits) with a TTL and appends
  the batch to the stream ``latgate:{sessions}:log`` (trimmed to ``log_entries``; the
  ``{sessions}`` hash tag keeps one script's keys in one Redis Cluster slot);
- **following the others**: :meth:`RedisSessionMap.run` reads that stream every
  ``poll_interval_seconds`` (one ``XRANGE`` from the last entry seen) and takes the
  placements other replicas wrote, so a session placed or moved elsewhere is seen here
  within about ``flush_delay_seconds + poll_interval_seconds`` (120 ms by default; a
  turn that reaches another replica sooner is routed without it); on start it reads
  the log from its beginning (bounded by its trimming);
- **read-through on a miss**: a ``get`` that finds nothing answers None at once and
  queues the key; the next flush reads the queued keys with one ``MGET``, so the next
  turn of that session finds its placement (a replica started after the log entry was
  trimmed).

Redis unreachable: placements fail open. ``get`` and ``put`` keep answering from the
local table, queued writes are dropped (bounded), and Redis is not tried again for
``backoff_seconds``; nothing raises into a request. Needs Redis 5 or later (streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from latgate.foundation.config.schema import StateConfig
from latgate.live.store.later import SendLater
from latgate.live.store.resp import RespClient, RespError, Script, bulk, failure_reason

log = logging.getLogger("latgate.store")

MAX_SESSIONS = 65536
"""Sessions a map keeps locally; the least recently used is forgotten first."""
TTL_SECONDS = 3600.0
"""A placement not used for this long is forgotten (locally and in Redis)."""
FLUSH_DELAY_SECONDS = 0.02
POLL_INTERVAL_SECONDS = 0.1
LOG_ENTRIES = 10_000
"""Batches the shared log keeps (each a flush of one replica)."""
MAX_PENDING_READS = 1024
BACKOFF_SECONDS = 1.0
KEY_PREFIX = "latgate:{sessions}:"
LOG_KEY = "latgate:{sessions}:log"
_POLL_COUNT = 512

# KEYS: the session keys, then the log. ARGV: TTL (ms), log length, this replica's
# origin id, then one endpoint id per session key. Sets each key with the TTL and adds
# one log entry: field "o" the origin, field "p" "KEY ENDPOINT KEY ENDPOINT ..." (the
# keys as Redis names them).
_PUT = """
local n = #KEYS - 1
local parts = {}
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[i + 3], 'PX', ARGV[1])
  parts[#parts + 1] = KEYS[i]
  parts[#parts + 1] = ARGV[i + 3]
end
redis.call('XADD', KEYS[n + 1], 'MAXLEN', ARGV[2], '*', 'o', ARGV[3], 'p', table.concat(parts, ' '))
return n
"""


class LocalSessionMap:
    """Session placements in this process: at most ``max_sessions`` (least recently used
    forgotten first), each forgotten ``ttl_seconds`` after it was last put or read.

    Args:
        max_sessions: entries kept.
        ttl_seconds: time to live of an entry since its last ``put`` or ``get``.
        clock: monotonic seconds (tests inject one).

    Example::

        sessions = LocalSessionMap()
        sessions.put(42, "vllm-0")
        sessions.get(42)  # 'vllm-0'
    """

    def __init__(
        self,
        *,
        max_sessions: int = MAX_SESSIONS,
        ttl_seconds: float = TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_sessions
        self._ttl = ttl_seconds
        self._clock = clock
        # session key -> [endpoint id, expires at, last written to the shared store at]
        # (str, float, float | None: a list, not a tuple, as get() renews it in place)
        self._entries: OrderedDict[int, list[Any]] = OrderedDict()

    def get(self, session_key: int) -> str | None:
        """The endpoint id that served the session last, or None (unknown or expired)."""
        entry = self._entries.get(session_key)
        if entry is None:
            return None
        now = self._clock()
        if entry[1] < now:
            del self._entries[session_key]
            return None
        entry[1] = now + self._ttl
        self._entries.move_to_end(session_key)
        return entry[0]

    def put(self, session_key: int, endpoint_id: str) -> None:
        """The session's latest turn was served by ``endpoint_id``."""
        self._set(session_key, endpoint_id, written_at=None)

    def _set(self, session_key: int, endpoint_id: str, *, written_at: float | None) -> list[Any]:
        """Set an entry; ``written_at`` None keeps the entry's own (a new one: never)."""
        now = self._clock()
        entries = self._entries
        entry = entries.get(session_key)
        if entry is None:
            entry = entries[session_key] = [
                endpoint_id,
                now + self._ttl,
                -1.0 if written_at is None else written_at,
            ]
            if len(entries) > self._max:
                entries.popitem(last=False)
            return entry
        entry[0], entry[1] = endpoint_id, now + self._ttl
        if written_at is not None:
            entry[2] = written_at
        entries.move_to_end(session_key)
        return entry

    def __len__(self) -> int:
        return len(self._entries)


class RedisSessionMap(LocalSessionMap):
    """Session placements shared by every replica through Redis (see the module
    docstring); ``get`` and ``put`` as :class:`LocalSessionMap`, never blocking.

    Args:
        url: the Redis URL (``[state] redis_url``).
        timeout_seconds: bound on each Redis call (``[state] redis_timeout_ms``).
        max_sessions / ttl_seconds / clock: as :class:`LocalSessionMap`; the TTL is also
            the Redis keys' expiry.
        flush_delay_seconds: queued writes and reads wait at most this long.
        poll_interval_seconds: how often :meth:`run` reads the others' placements.
        log_entries: the shared log's length (entries, each one replica's flush).
        backoff_seconds: after a failed call, Redis is not tried for this long.

    Start :meth:`run` as a task for the app's lifetime and :meth:`aclose` at shutdown.
    Writes need a running event loop (a ``put`` outside one is queued until
    :meth:`flush`).
    """

    def __init__(
        self,
        *,
        url: str,
        timeout_seconds: float,
        max_sessions: int = MAX_SESSIONS,
        ttl_seconds: float = TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        flush_delay_seconds: float = FLUSH_DELAY_SECONDS,
        poll_interval_seconds: float = POLL_INTERVAL_SECONDS,
        log_entries: int = LOG_ENTRIES,
        backoff_seconds: float = BACKOFF_SECONDS,
    ) -> None:
        super().__init__(max_sessions=max_sessions, ttl_seconds=ttl_seconds, clock=clock)
        self._client = RespClient(url, timeout_seconds=timeout_seconds)
        self._poll_interval = poll_interval_seconds
        self._backoff = backoff_seconds
        self._origin = os.urandom(6).hex()
        self._put_script = Script(_PUT)
        self._fixed_args = [
            bulk(str(max(1, int(ttl_seconds * 1000))).encode()),
            bulk(str(log_entries).encode()),
            bulk(self._origin.encode()),
        ]
        self._log_key = bulk(LOG_KEY.encode())
        self._writes: dict[int, str] = {}
        self._reads: set[int] = set()
        self._flush_later = SendLater(self.flush, delay_seconds=flush_delay_seconds)
        self._last_id = b"0-0"
        self._down_until = 0.0
        self._down = False

    @property
    def reachable(self) -> bool:
        """False between a failed Redis call and the next successful one."""
        return not self._down

    def get(self, session_key: int) -> str | None:
        endpoint = super().get(session_key)
        if endpoint is None and len(self._reads) < MAX_PENDING_READS:
            self._reads.add(session_key)
            self._flush_later.schedule()
        return endpoint

    def put(self, session_key: int, endpoint_id: str) -> None:
        entry = self._entries.get(session_key)
        now = self._clock()
        if entry is not None and entry[0] == endpoint_id and now - entry[2] < self._ttl / 4:
            super().put(session_key, endpoint_id)  # unchanged and written recently: local only
            return
        self._set(session_key, endpoint_id, written_at=now)
        if len(self._writes) < self._max:
            self._writes[session_key] = endpoint_id
            self._flush_later.schedule()

    async def flush(self) -> None:
        """Write the queued placements and read the queued misses now (one call each);
        Redis down: both are dropped."""
        writes, self._writes = self._writes, {}
        reads, self._reads = self._reads, set()
        if writes:
            keys = [bulk(_redis_key(key)) for key in writes]
            args = [*self._fixed_args, *(bulk(endpoint.encode()) for endpoint in writes.values())]
            await self._call(self._client.run, self._put_script, [*keys, self._log_key], args)
        if reads:
            order = list(reads)
            values = await self._call(self._client.call, b"MGET", *(_redis_key(key) for key in order))
            for key, value in zip(order, values or (), strict=False):
                if value is not None and key not in self._entries:
                    self._set(key, value.decode(), written_at=self._clock())

    async def poll(self) -> int:
        """Take the placements other replicas logged since the last poll; returns how
        many were taken (0 with Redis down)."""
        taken = 0
        while True:
            entries = await self._call(
                self._client.call, b"XRANGE", LOG_KEY, self._last_id, b"+", b"COUNT", _POLL_COUNT
            )
            if not entries:
                return taken
            fresh = [entry for entry in entries if entry[0] != self._last_id]
            self._last_id = entries[-1][0]
            now = self._clock()
            for _, fields in fresh:
                taken += self._take(fields, now)
            if len(entries) < _POLL_COUNT:
                return taken

    def _take(self, fields: list[bytes], now: float) -> int:
        """One log entry's placements, unless this replica wrote it."""
        values = dict(zip(fields[::2], fields[1::2], strict=False))
        if values.get(b"o") == self._origin.encode():
            return 0
        parts = (values.get(b"p") or b"").split(b" ")
        taken = 0
        for raw_key, endpoint in zip(parts[::2], parts[1::2], strict=False):
            try:
                key = int(raw_key.removeprefix(KEY_PREFIX.encode()), 16)
            except ValueError:
                continue
            self._set(key, endpoint.decode(), written_at=now)
            taken += 1
        return taken

    async def run(self) -> None:
        """Poll the shared log every ``poll_interval_seconds`` until cancelled."""
        while True:
            await self.poll()
            await asyncio.sleep(self._poll_interval)

    async def aclose(self) -> None:
        """Write what is queued, then close the connection."""
        self._flush_later.cancel()
        await self._flush_later.wait()
        await self.flush()
        await self._client.aclose()

    async def _call(self, operation: Callable[..., Awaitable[Any]], *args: object) -> Any:
        """One Redis call's reply (as :meth:`RespClient.call` returns it), or None when
        Redis is down or in its back-off period."""
        if self._down and self._clock() < self._down_until:
            return None
        try:
            result = await operation(*args)
        except (RespError, OSError) as exc:  # TimeoutError (connecting) is an OSError
            if isinstance(exc, TimeoutError):
                self._client.reset()
            self._down_until = self._clock() + self._backoff
            if not self._down:
                self._down = True
                log.warning(
                    "session placements: the shared store (Redis) is unreachable (%s); kept in process, "
                    "retrying every %.1f s",
                    failure_reason(exc),
                    self._backoff,
                )
            return None
        if self._down:
            self._down = False
            log.info("session placements: the shared store (Redis) is reachable again")
        return result


def open_session_map(config: StateConfig) -> LocalSessionMap | RedisSessionMap:
    """The map ``[state]`` asks for: shared over ``redis_url`` (bounded by
    ``redis_timeout_ms``), else in process. No I/O here."""
    if config.redis_url:
        return RedisSessionMap(url=config.redis_url, timeout_seconds=config.redis_timeout_ms / 1000)
    return LocalSessionMap()


def _redis_key(session_key: int) -> bytes:
    return b"%s%016x" % (KEY_PREFIX.encode(), session_key & 0xFFFFFFFFFFFFFFFF)


class SessionMaps:
    """The session map of the current ``[state]``: a reload with the same section keeps
    every placement (and a shared map keeps following the other replicas), one with
    another retires the map (a shared one writes its queue and closes at once; nothing
    keeps either). Like :class:`~latgate.live.store.SharedStores` for limits. Run :meth:`run`
    as a task for the app's lifetime (it follows the current shared map's log, else
    waits) and :meth:`aclose` at shutdown."""

    def __init__(self) -> None:
        self._current: LocalSessionMap | None = None
        self._config: StateConfig | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()

    def map_for(self, config: StateConfig) -> LocalSessionMap:
        """The map for ``config`` (the same object while ``config`` is equal)."""
        if self._current is None or config != self._config:
            if isinstance(self._current, RedisSessionMap):  # no loop (outside the app): it never wrote
                with contextlib.suppress(RuntimeError):
                    task = asyncio.get_running_loop().create_task(self._current.aclose())
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
            self._current = open_session_map(config)
            self._config = config
            self._changed.set()
        return self._current

    async def closed(self) -> None:
        """Wait until every retired map is closed."""
        await asyncio.gather(*self._closing, return_exceptions=True)

    async def run(self) -> None:
        """Follow the current shared map until cancelled (a reload that opens another
        is followed from then on)."""
        while True:
            self._changed.clear()
            current = self._current
            if isinstance(current, RedisSessionMap):
                follow = asyncio.ensure_future(current.run())
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait({follow, changed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    follow.cancel()
                    changed.cancel()
                    await asyncio.gather(follow, changed, return_exceptions=True)
            else:
                await self._changed.wait()

    async def aclose(self) -> None:
        """Write what shared maps have queued and close their connections."""
        await self.closed()
        current, self._current = self._current, None
        if isinstance(current, RedisSessionMap):
            await current.aclose()
