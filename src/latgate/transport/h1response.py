"""An upstream response read on one :class:`~latgate.transport.h1conn.H1Connection`: its
status and headers as they arrived, its body as an async byte iterator."""

from __future__ import annotations

from latgate.transport.h1conn import H1Connection
from latgate.transport.response_body import SelfIteratingBody


class H1Response(SelfIteratingBody):
    """An upstream response whose status and headers arrived; the body streams.

    latgate's :class:`~latgate.transport.upstream.UpstreamResponse`: ``status_code``,
    ``headers`` (:class:`Headers`), ``aiter_raw()`` (the body as it arrives, dechunked,
    undecoded), ``aclose()`` (must be called: it returns the connection to the pool or
    closes it), ``close_connection()``, ``followed`` (the URL of the same-origin
    redirect followed to get it, set by the client, else ``None``); and ``aread()``,
    the whole body.
    """

    __slots__ = ("_conn", "_done", "followed", "headers", "status_code")

    def __init__(self, conn: H1Connection) -> None:
        self._conn = conn
        self._done = False
        self.followed: str | None = None
        self.status_code = conn.status
        self.headers = conn.headers()

    async def __anext__(self) -> bytes:
        """The next body bytes (all that arrived since the last call).

        Raises:
            StopAsyncIteration: the body is complete.
            UpstreamFailure: the connection broke, timed out or sent a malformed body.
        """
        conn = self._conn
        while True:
            if conn.has_body():
                return conn.take_body()
            if conn.complete:
                raise StopAsyncIteration
            if conn.error is not None:
                raise conn.error.fresh()
            await conn.wait()

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._conn.finished()

    def close_connection(self) -> None:
        """Done with, and its connection closed rather than kept (a redirect's: its
        upstream often closes it without saying so, as the follow-up is written)."""
        if not self._done:
            self._done = True
            self._conn.close()
