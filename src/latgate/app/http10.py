"""The response framing of an HTTP/1.0 request on uvicorn's httptools protocol.

uvicorn chunks a response without ``Content-Length`` whatever the request's version, and
HTTP/1.0 has no chunked coding (RFC 9112 sections 6.1 and 6.3). :mod:`latgate.app.httplimits`
swaps an HTTP/1.0 request's cycle for :class:`Http10Cycle` before its task runs. It
reads and writes members of uvicorn's ``RequestResponseCycle``, which is no public API
(``tests/test_uvicorn_contract.py`` guards its ``send`` and the attributes used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

if TYPE_CHECKING:
    from uvicorn._types import ASGISendEvent


class Http10Cycle(RequestResponseCycle):
    """uvicorn's request/response cycle for an HTTP/1.0 request: a response without
    ``Content-Length`` or ``Transfer-Encoding`` is close-delimited (RFC 9112 section
    6.3, rule 8) instead of chunked; uvicorn already closes an HTTP/1.0 connection
    after its response and says ``connection: close``."""

    _close_delimited = False

    async def send(self, message: ASGISendEvent) -> None:
        if not self.response_started and message["type"] == "http.response.start":
            framed = (b"content-length", b"transfer-encoding")
            if not any(name.lower() in framed for name, _ in message.get("headers", ())):
                self._close_delimited = True
                self.chunked_encoding = False
        elif self._close_delimited and message["type"] == "http.response.body":
            # uvicorn writes a body that is not chunked against a Content-Length: each
            # piece is its own, and the end of the connection ends the body
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)
