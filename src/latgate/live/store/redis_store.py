"""Redis, the store shared by every gateway replica: rate limits and provider health.

Every rate-limit step is one Lua script (Redis runs a script atomically), so two
replicas charging the same key at the same moment cannot both take the last unit.
Time is Redis's own (``TIME``), so replicas with skewed clocks agree. Keys:

- ``latgate:rl:{NAME}:rpm`` / ``latgate:rl:{NAME}:tpm``: a GCRA theoretical arrival
  time (see :mod:`latgate.live.store.base`) with an expiry when it is back to full. The
  ``{NAME}`` hash tag keeps a key's two quotas in one Redis Cluster slot.
- ``latgate:health:PROVIDER:ENDPOINT``: present while that endpoint is ejected (see
  :mod:`latgate.live.store.health`), with a time to live.

Calls go through :class:`~latgate.live.store.resp.RespClient` (one pipelined connection);
a request's charge is one script call. Never hanging a request: every call is bounded
by ``timeout_seconds`` (connecting, and the reply: the client's timer fails the calls
waiting on a connection whose oldest reply is late, and drops it), nothing is retried,
and after a failure
the store does not try again for ``backoff_seconds``: calls in that period raise
:class:`~latgate.live.store.base.StoreUnavailable` at once. The rate limiter then fails
open or closed as ``[state] fail_open`` says. Log lines name the exception type only
(a refused login: Redis's ``NOAUTH`` / ``WRONGPASS`` and what it means), never the URL
(it can carry a password and an internal host name).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from latgate.live.store.base import Quota, StoreUnavailable, Verdict
from latgate.live.store.later import SendLater
from latgate.live.store.resp import RespAuthError, RespClient, RespError, Script, bulk, failure_reason

log = logging.getLogger("latgate.store")
T = TypeVar("T")
PREFIX = "latgate:"
BACKOFF_SECONDS = 1.0

# KEYS: the quotas. ARGV: three numbers per key in turn: its window (seconds), this
# charge's step (cost * window / limit: how far it moves the TAT, seconds) and a
# correction of past charges (seconds, may be negative). Corrections are applied
# whatever the verdict, the TAT kept within [now, now + window] (the debt bound of
# latgate.live.store.base.corrected_tat); then every quota is charged, or none. Returns one string,
# "ALLOWED WAIT ROOM...": ALLOWED 1 when charged else 0, WAIT the seconds until every
# charge would fit (0 when charged), then per key the seconds until a charge of the same
# step would fit that key alone (0: it would now).
_ACQUIRE = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = #KEYS
local tats, corrected = {}, {}
local wait = 0
for i = 1, n do
  local window, step, correction = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  if correction ~= 0 then
    tat = tat + correction
    if tat < now then tat = now end
    if tat > now + window then tat = now + window end
    corrected[i] = true
  end
  tats[i] = tat
  local over = tat + step - now - window
  if over > 0.000000001 and over > wait then wait = over end
end
local charged = wait == 0
local out = {charged and '1' or '0', string.format('%.6f', wait)}
for i = 1, n do
  local window, step = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1])
  local tat = tats[i]
  if charged then tat = tat + step end
  if charged or corrected[i] then
    local ttl = math.ceil((tat - now) * 1000)
    if ttl > 0 then
      redis.call('SET', KEYS[i], string.format('%.6f', tat), 'PX', ttl)
    else
      redis.call('DEL', KEYS[i])
    end
  end
  local room = tat + step - now - window
  if room <= 0.000000001 then room = 0 end
  out[i + 2] = string.format('%.6f', room)
end
return table.concat(out, ' ')
"""

#: A correction (:meth:`RedisStore.adjust`) waits at most this long for a charge of the
#: same key to carry it; then it is sent on its own.
CORRECTION_DELAY_SECONDS = 1.0
#: at most this many quota keys' encodings are kept (a config names a few hundred)
ENCODED_KEYS_KEPT = 4096
_ZERO = bulk(b"0")


def _slot_tag(key: str) -> str:
    """The Redis Cluster hash tag of ``key`` (``{NAME}``), or the key itself."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start : end + 1] if start >= 0 and end > start + 1 else key


def _number(value: float) -> bytes:
    return bulk(repr(float(value)).encode())


class RedisStore:
    """Rate limits and endpoint health in Redis.

    Args:
        url: ``redis://HOST:PORT/DB``, ``rediss://...`` or ``unix://PATH``.
        timeout_seconds: bound on each call (connect, reply).
        backoff_seconds: after a failure, calls fail at once for this long.
        clock: monotonic seconds, for the back-off (tests inject one).

    No I/O happens here: the first call connects. Use it on one event loop.
    """

    shared = True

    def __init__(
        self,
        *,
        url: str,
        timeout_seconds: float,
        backoff_seconds: float = BACKOFF_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = RespClient(url, timeout_seconds=timeout_seconds)
        self._timeout = timeout_seconds
        self._backoff = backoff_seconds
        self._clock = clock
        self._down_until = 0.0
        self._down = False
        self._acquire = Script(_ACQUIRE)
        # corrections not yet sent: quota key -> (window seconds, TAT seconds); see adjust()
        self._corrections: dict[str, tuple[float, float]] = {}
        self._corrections_later = SendLater(self._send_corrections, delay_seconds=CORRECTION_DELAY_SECONDS)
        self._encoded: dict[str, tuple[bytes, bytes]] = {}  # quota key -> (key, window) as RESP

    @property
    def reachable(self) -> bool:
        """False between a failed call and the next successful one."""
        return not self._down

    async def acquire(self, quotas: Sequence[Quota]) -> Verdict:
        """Charge every quota or none, atomically across replicas, in one script call
        that also carries the corrections waiting for these quotas (:meth:`adjust`).

        Raises:
            StoreUnavailable: Redis did not answer within the timeout, or is in its
                back-off period.
        """
        corrections = self._corrections
        keys: list[bytes] = []
        args: list[bytes] = []
        for q in quotas:
            key, window = self._encoded.get(q.key) or self._encode(q)
            keys.append(key)
            correction = corrections.pop(q.key, None) if corrections else None
            args += (window, _number(q.cost * q.window_seconds / q.limit), _number(correction[1]) if correction else _ZERO)
        reply = (await self._call(self._client.run, self._acquire, keys, args)).split()
        return Verdict(
            allowed=reply[0] == b"1",
            retry_after_seconds=float(reply[1]),
            room_in_seconds=tuple(map(float, reply[2:])),
        )

    def _encode(self, quota: Quota) -> tuple[bytes, bytes]:
        if len(self._encoded) >= ENCODED_KEYS_KEPT:
            self._encoded.clear()
        encoded = self._encoded[quota.key] = (bulk((PREFIX + quota.key).encode()), _number(quota.window_seconds))
        return encoded

    async def adjust(self, quota: Quota, *, delta: float) -> None:
        """Correct a past charge by ``delta`` units, without a call of its own: the
        correction goes with the next charge of the same quota, or on its own within
        :data:`CORRECTION_DELAY_SECONDS`; an unreachable Redis loses it."""
        _, seconds = self._corrections.get(quota.key, (0.0, 0.0))
        self._corrections[quota.key] = (quota.window_seconds, seconds + delta * quota.window_seconds / quota.limit)
        self._corrections_later.schedule()

    async def _send_corrections(self) -> None:
        """Every waiting correction, one script call per slot; failures lose them."""
        by_slot: dict[str, tuple[list[bytes], list[bytes]]] = {}
        for key, (window, seconds) in self._corrections.items():
            keys, args = by_slot.setdefault(_slot_tag(key), ([], []))
            keys.append(bulk((PREFIX + key).encode()))
            args += (_number(window), _ZERO, _number(seconds))
        self._corrections.clear()
        for keys, args in by_slot.values():
            try:
                await self._call(self._client.run, self._acquire, keys, args)
            except StoreUnavailable:
                pass

    async def mark_endpoint(self, key: str, *, ejected: bool, ttl_seconds: float) -> None:
        """Publish one endpoint's health: ``ejected`` sets the mark for ``ttl_seconds``,
        else it is removed.

        Raises:
            StoreUnavailable: as :meth:`acquire`.
        """
        name = PREFIX + "health:" + key
        if ejected:
            await self._call(self._client.call, b"SET", name, b"ejected", b"PX", max(1, int(ttl_seconds * 1000)))
        else:
            await self._call(self._client.call, b"DEL", name)

    async def ejected_endpoints(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` (``PROVIDER:ENDPOINT``) are marked ejected now.

        Raises:
            StoreUnavailable: as :meth:`acquire`.
        """
        if not keys:
            return set()
        values = await self._call(self._client.call, b"MGET", *(PREFIX + "health:" + k for k in keys))
        return {key for key, value in zip(keys, values, strict=True) if value is not None}

    async def aclose(self) -> None:
        """Send the waiting corrections, then close the connection."""
        self._corrections_later.cancel()
        await self._send_corrections()
        await self._corrections_later.wait()
        await self._client.aclose()

    async def _call(self, operation: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._down and self._clock() < self._down_until:
            raise StoreUnavailable("the shared store (Redis) is unreachable")
        try:
            result = await operation(*args)  # bounded by the client's timeout
        except (RespError, OSError) as exc:  # TimeoutError (connecting) is an OSError
            if isinstance(exc, TimeoutError):
                self._client.reset()  # a hung server: the next call connects afresh
            self._down_until = self._clock() + self._backoff
            if not self._down:
                self._down = True
                if isinstance(exc, RespAuthError):
                    log.warning(
                        "the shared store (Redis) refused latgate's login: authentication failed (%s); "
                        "retrying every %.1f s",
                        exc,
                        self._backoff,
                    )
                else:
                    log.warning(
                        "the shared store (Redis) is unreachable (%s); retrying every %.1f s",
                        failure_reason(exc),
                        self._backoff,
                    )
            raise StoreUnavailable("the shared store (Redis) is unreachable") from None
        if self._down:
            self._down = False
            log.info("the shared store (Redis) is reachable again")
        return result

