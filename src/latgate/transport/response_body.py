"""The body side shared by latgate's upstream responses: a response that is its own
async iterator of body bytes."""

from __future__ import annotations

from typing import Self


class SelfIteratingBody:
    """A response whose body is read by iterating the response itself: ``aiter_raw()``
    and ``__aiter__`` return it, ``__anext__`` (the subclass's) gives the next bytes as
    they arrive, ``aread()`` joins them all.

    The iteration half of :class:`~latgate.transport.upstream.UpstreamResponse`, for
    :class:`~latgate.transport.h1response.H1Response` and
    :class:`~latgate.transport.decoding.DecodedResponse`.
    """

    __slots__ = ()

    def aiter_raw(self) -> Self:
        return self

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        raise NotImplementedError

    async def aread(self) -> bytes:
        """The whole body.

        Raises:
            UpstreamFailure: as ``__anext__``.
        """
        return b"".join([chunk async for chunk in self])
