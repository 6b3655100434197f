"""An upstream transport that answers from memory, for the tests of what
:class:`~latgate.transport.upstream.UpstreamClient` adds over any transport (redirects,
decoding, the GETs, foreign exceptions translated): the same client code as over
latgate's own pool (:class:`~latgate.transport.h1.H1Pool`), which the loopback tests drive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from latgate.transport.egress import Egress


@dataclass
class Sent:
    """One request the transport was given."""

    method: str
    url: str
    payload: bytes
    headers: dict[str, str]
    egress: Egress | None
    group: str


@dataclass
class MemoryResponse:
    """An :class:`~latgate.transport.upstream.UpstreamResponse` whose body is ``reads``, one
    per read (an exception in it is raised at that read). ``ended``: ``"kept"`` after
    ``aclose``, ``"closed"`` after ``close_connection``."""

    status_code: int
    headers: Mapping[str, str] = field(default_factory=dict)
    reads: list[bytes | BaseException] = field(default_factory=list)
    followed: str | None = None
    ended: str | None = None

    async def _body(self) -> AsyncIterator[bytes]:
        for read in self.reads:
            if isinstance(read, BaseException):
                raise read
            yield read

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._body()

    async def aclose(self) -> None:
        self.ended = self.ended or "kept"

    def close_connection(self) -> None:
        self.ended = self.ended or "closed"


class MemoryTransport:
    """An :class:`~latgate.transport.upstream.UpstreamTransport`: ``answer(sent)`` returns
    each request's :class:`MemoryResponse` (or raises, as a transport may). Keeps what
    it was sent (``sent``) and answered (``answered``)."""

    def __init__(self, answer: Callable[[Sent], MemoryResponse]) -> None:
        self.answer = answer
        self.sent: list[Sent] = []
        self.answered: list[MemoryResponse] = []
        self.closed = False

    async def post(
        self,
        *,
        url: str,
        payload: bytes,
        headers: dict[str, str],
        read_timeout_seconds: float | None,
        egress: Egress | None = None,
        group: str = "",
        max_connections: int | None = None,
        method: str = "POST",
    ) -> MemoryResponse:
        sent = Sent(method, url, payload, dict(headers), egress, group)
        self.sent.append(sent)
        response = self.answer(sent)
        self.answered.append(response)
        return response

    def in_use(self) -> dict[str, int]:
        return {}

    def retire(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
