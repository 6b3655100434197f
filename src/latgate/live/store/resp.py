"""A lean Redis client for the few commands the shared store sends (its Lua scripts,
``SET``, ``DEL``, ``MGET``): RESP2 (the Redis serialization protocol, "RESP protocol
spec" in the Redis documentation) pipelined over one asyncio connection.

Replies come back in the order the commands were written, so each command queues a
future and each parsed reply resolves the oldest one; a command given up on (its
caller cancelled) keeps its place in the queue and its reply is dropped when it comes,
so the stream never goes out of step. One connection serves every concurrent call of
an event loop: Redis runs commands one at a time anyway. The commands of one turn of
the loop go out in one write, and one timer per connection bounds the replies (not one
per call); together a fraction of a general-purpose client's connection pool round.

The wire format (commands, replies, scripts) is :mod:`latgate.live.store.resp_wire`; this
module owns the connection.

URLs: as :class:`~latgate.foundation.config.redis_url.RedisAddress` reads them (``rediss://``:
TLS, the system's trust store).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

from latgate.foundation.config.redis_url import DEFAULT_PORT, RedisAddress
from latgate.live.store.resp_wire import INCOMPLETE, RespError, Script, bulk, encode, parse
from latgate.transport.errors import failure_cause

__all__ = [
    "DEFAULT_PORT", "RedisAddress", "RespAuthError", "RespClient", "RespError", "RespTimeout", "Script", "bulk",
    "failure_reason",
]  # fmt: skip

#: the reply timer may run this much before its deadline (timer resolution)
TIMER_SLACK_SECONDS = 0.002




class RespTimeout(RespError):
    """Redis did not answer a command within the client's timeout; the connection was
    dropped (the next call opens another)."""


def failure_reason(exc: BaseException) -> str:
    """Why a Redis call failed, for a log line an operator can act on, naming no address
    and no password: ``cannot connect: connection refused`` (or ``DNS name not found``,
    ``TLS: ...``, ``no answer within redis_timeout_ms``), ``timeout (no reply within
    redis_timeout_ms)``, ``the connection to Redis was lost``, or Redis's own error
    reply (``LOADING ...``); latgate's :class:`RespError` messages hold no address."""
    if isinstance(exc, TimeoutError | RespTimeout):
        return "timeout (no reply within redis_timeout_ms)"
    if isinstance(exc, RespError):
        return str(exc)
    return failure_cause(exc)


class RespAuthError(RespError):
    """Redis refused latgate's login: it wants a password the URL lacks (``NOAUTH``),
    or refused the URL's user name or password (``WRONGPASS``, or an ``AUTH`` error such
    as a password sent to a server that has none). The message names the cause, never
    the password."""


#: the first word of Redis's error reply -> what a log line says of it
_AUTH_CODES = {
    "NOAUTH": "Redis requires a password and [state] redis_url gives none",
    "WRONGPASS": "Redis refused the user name or password in [state] redis_url",
}


class RespClient:
    """Commands to one Redis server over one pipelined connection, opened on first use
    and again after it is lost or :meth:`reset`.

    Args:
        url: see the module docstring.
        timeout_seconds: bound on each call: on connecting (and authenticating) and on
            each reply. A reply not in by then fails every call waiting on the
            connection and drops it (a server that has not answered the oldest command
            in time is hung or overloaded; replies come in order, so the others would
            wait at least as long); one timer per connection checks the oldest, not one
            per call.

    Raises (from :meth:`call` and :meth:`run`):
        RespTimeout: no reply within ``timeout_seconds``.
        TimeoutError: no connection within ``timeout_seconds`` of the call.
        RespError: as its docstring says.
    """

    def __init__(self, url: str, *, timeout_seconds: float) -> None:
        address = RedisAddress.parse(url)
        self._unix = address.unix_path
        self._host = address.host
        self._port = address.port
        self._tls = ssl.create_default_context() if address.tls else None
        self._username = address.username
        self._password = address.password
        self._db = address.db
        self._timeout = timeout_seconds
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    async def call(self, *args: bytes | str | float) -> Any:
        """One command's reply: ``bytes`` (bulk), ``str`` (status), ``int``, ``None`` or a
        list of those."""
        protocol = self._protocol
        if protocol is None or protocol.lost:
            async with asyncio.timeout(self._timeout):  # the connection and the reply
                return _raise_error(await (await self._connected()).send(encode(args)))
        return _raise_error(await protocol.send(encode(args)))

    async def run(self, script: Script, keys: Sequence[bytes], args: Sequence[bytes]) -> Any:
        """``script`` with ``keys`` and ``args``, each already one RESP bulk string
        (:func:`bulk`); its reply as :meth:`call` returns it."""
        protocol = self._protocol
        if protocol is None or protocol.lost:
            async with asyncio.timeout(self._timeout):  # the connection and the reply
                return await self._run(await self._connected(), script, keys, args)
        return await self._run(protocol, script, keys, args)

    @staticmethod
    async def _run(protocol: _Protocol, script: Script, keys: Sequence[bytes], args: Sequence[bytes]) -> Any:
        tail = b"".join((b"$%d\r\n%d\r\n" % (len(str(len(keys))), len(keys)), *keys, *args))
        count = 3 + len(keys) + len(args)
        reply = await protocol.send(script.evalsha(count) + tail)
        if isinstance(reply, RespError) and str(reply).startswith("NOSCRIPT"):
            reply = await protocol.send(script.eval(count) + tail)
        return _raise_error(reply)

    def reset(self) -> None:
        """Drop the connection (after a timeout: the server may be hung); the next call reconnects."""
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None

    async def aclose(self) -> None:
        """Close the connection."""
        self.reset()

    async def _connected(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and not protocol.lost:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(self._connected_or_not)
        return await asyncio.shield(self._connecting)

    def _connected_or_not(self, future: asyncio.Future[_Protocol]) -> None:
        self._connecting = None
        if not future.cancelled() and future.exception() is None:
            self._protocol = future.result()

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout):
                if self._unix is not None:
                    _, protocol = await loop.create_unix_connection(self._new_protocol, self._unix)
                else:
                    _, protocol = await loop.create_connection(
                        self._new_protocol, self._host, self._port, ssl=self._tls
                    )
                    sock = protocol.transport.get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await self._hello(protocol)
        except OSError as exc:  # TimeoutError (the connect deadline) is an OSError
            why = "no answer within redis_timeout_ms" if isinstance(exc, TimeoutError) else failure_cause(exc)
            raise RespError(f"cannot connect: {why}") from None
        return protocol

    def _new_protocol(self) -> _Protocol:
        return _Protocol(timeout_seconds=self._timeout)

    async def _hello(self, protocol: _Protocol) -> None:
        """Log in and select the database; a refusal closes the connection."""
        hello: list[tuple[bytes | str | int, ...]] = []
        if self._password is not None:
            hello.append((b"AUTH", self._username, self._password) if self._username else (b"AUTH", self._password))
        if self._db:
            hello.append((b"SELECT", self._db))
        try:
            for command in hello:
                reply = await protocol.send(encode(command))
                if isinstance(reply, RespError) and command[0] == b"AUTH":
                    raise _auth_error(reply, default="Redis refused the AUTH of [state] redis_url")
                _raise_error(reply)
        except BaseException:
            protocol.close()
            raise


class _Protocol(asyncio.Protocol):
    def __init__(self, *, timeout_seconds: float) -> None:
        self.waiting: deque[tuple[asyncio.Future[Any], float]] = deque()  # (future, reply deadline)
        self.buffer = bytearray()
        self.lost = False
        self.timeout = timeout_seconds
        self.loop = asyncio.get_running_loop()
        self.watch: asyncio.TimerHandle | None = None
        self.unsent: list[bytes] | None = None  # commands to write at the end of this loop turn
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream connection (create_connection, create_unix_connection) is given a Transport
        self.transport = cast(asyncio.Transport, transport)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        if self.lost:
            future.set_exception(RespError("the connection to Redis was lost"))
            return future
        deadline = self.loop.time() + self.timeout
        self.waiting.append((future, deadline))
        if self.watch is None:
            self.watch = self.loop.call_at(deadline, self._check_oldest)
        if self.unsent is None:
            self.unsent = [command]
            self.loop.call_soon(self._write)
        else:
            self.unsent.append(command)
        return future

    def _write(self) -> None:
        """Every command sent in this turn of the loop, in one write (one syscall)."""
        unsent, self.unsent = self.unsent, None
        if unsent and not self.lost:
            self.transport.write(unsent[0] if len(unsent) == 1 else b"".join(unsent))

    def _check_oldest(self) -> None:
        """The reply timer: fail everything when the oldest command is overdue, else
        wait for its deadline."""
        self.watch = None
        if self.lost or not self.waiting:
            return
        deadline = self.waiting[0][1]
        if self.loop.time() + TIMER_SLACK_SECONDS >= deadline:
            self.close(RespTimeout("Redis did not answer in time"))
        else:
            self.watch = self.loop.call_at(deadline, self._check_oldest)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        at = 0
        while self.waiting:
            try:
                value, end = parse(self.buffer, at)
            except (RespError, ValueError):  # not RESP: nothing after it can be trusted
                self.close()
                return
            if value is INCOMPLETE:
                break
            at = end
            future, _ = self.waiting.popleft()
            if not future.done():  # else given up on by its caller: the reply is dropped
                future.set_result(value)
        if at:
            del self.buffer[:at]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RespError("the connection to Redis was lost"))

    def close(self, error: RespError | None = None) -> None:
        self.transport.close()
        self._fail(error or RespError("the connection to Redis was lost"))

    def _fail(self, error: RespError) -> None:
        self.lost = True
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        while self.waiting:
            future, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)


def _auth_error(reply: RespError, *, default: str) -> RespAuthError:
    code = str(reply).split(" ", 1)[0]
    return RespAuthError(f"{code}: {_AUTH_CODES.get(code, default)}")


def _raise_error(reply: Any) -> Any:
    if isinstance(reply, RespError):
        if str(reply).split(" ", 1)[0] in _AUTH_CODES:
            raise _auth_error(reply, default="")
        raise reply
    return reply
