"""An HTTP ``CONNECT`` tunnel through a proxy (RFC 9110 section 9.3.6), for an https
upstream behind a corporate proxy: the proxy's TCP connection is asked for a tunnel to
``host:port``; once the proxy answers 2xx, TLS to the upstream runs inside it
(``loop.start_tls``), so the proxy sees neither the request nor the provider's key.
"""

from __future__ import annotations

import asyncio
import ssl

from latgate.transport.errors import UpstreamFailure

__all__ = ["open_tunnel"]

#: A proxy's answer to CONNECT longer than this is not one.
MAX_REPLY_BYTES = 16 * 1024


class _Reply(asyncio.Protocol):
    """Reads the proxy's answer head; ``status`` resolves to its status code."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.status: asyncio.Future[int] = loop.create_future()
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        if self.status.done():
            return
        self._buffer += data
        if b"\r\n\r\n" not in self._buffer:
            if len(self._buffer) > MAX_REPLY_BYTES:
                self.status.set_exception(UpstreamFailure("connect", "could not connect to upstream: the proxy's answer is malformed"))
            return
        line = self._buffer.split(b"\r\n", 1)[0].split()
        if len(line) < 2 or not line[0].startswith(b"HTTP/1.") or not line[1].isdigit():
            self.status.set_exception(UpstreamFailure("connect", "could not connect to upstream: the proxy's answer is malformed"))
        else:
            self.status.set_result(int(line[1]))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.status.done():
            self.status.set_exception(ConnectionResetError("the proxy closed the connection"))


def _refusal(status: int) -> str:
    hint = {407: "proxy credentials missing or wrong", 403: "the proxy forbids this host"}.get(status)
    return f"could not connect to upstream: the proxy refused the tunnel (HTTP {status}{': ' + hint if hint else ''})"


async def open_tunnel(
    loop: asyncio.AbstractEventLoop,
    protocol: asyncio.Protocol,
    *,
    proxy: tuple[str, int],
    request: bytes,
    context: ssl.SSLContext,
    server_hostname: str,
) -> asyncio.Transport:
    """Connect to ``proxy``, send the ``CONNECT`` ``request`` (head bytes), and start TLS
    to ``server_hostname`` inside the tunnel with ``protocol`` on top.

    Returns:
        the TLS transport (``protocol.connection_made`` already called).

    Raises:
        UpstreamFailure: ``connect`` when the proxy answers anything but 2xx (its status
            named: 407 means missing or wrong proxy credentials).
        OSError, ssl.SSLError: the proxy cannot be reached, or the TLS handshake failed.
    """
    reply = _Reply(loop)
    transport, _ = await loop.create_connection(lambda: reply, proxy[0], proxy[1])
    try:
        transport.write(request)
        status = await reply.status
        if not 200 <= status < 300:
            raise UpstreamFailure("connect", _refusal(status))
        tls = await loop.start_tls(transport, protocol, context, server_hostname=server_hostname)
    except BaseException:
        transport.abort()
        raise
    assert tls is not None
    protocol.connection_made(tls)
    return tls
