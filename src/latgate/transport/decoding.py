"""Compressed upstream answers, decoded as they arrive.

latgate asks every upstream for ``Accept-Encoding: identity``, but some servers, CDNs
and gateways compress whatever the request says. Such an answer is a well-formed one:
:class:`DecodedResponse` wraps it and hands on the decoded body, chunk by chunk, with
the decoded size bounded (the caller's bound, ``[defaults] max_response_bytes`` from the
forwarder), in steps of at most :data:`STEP_BYTES` each, so a small compressed chunk
cannot expand into a large buffer at once nor hold the event loop.

Codings (RFC 9110 section 8.4.1, applied in the order listed, so decoded in reverse):
``gzip`` / ``x-gzip`` (RFC 1952, several members allowed), ``deflate`` (RFC 1950 zlib;
a raw RFC 1951 stream is accepted too, as browsers and httpx do), ``br`` (RFC 7932,
the ``brotli`` package) and ``zstd`` (RFC 8878, the ``zstandard`` package), ``identity``.
A body that does not decode, or ends mid-stream, is the provider's failure
(:class:`~latgate.transport.errors.UpstreamFailure` ``read``); a coding latgate cannot
decode is refused before the body is read (:func:`decoder_problem`).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import brotli
import zstandard

from latgate.transport.errors import UpstreamFailure
from latgate.transport.response_body import SelfIteratingBody

__all__ = ["MAX_DECODED_BYTES", "DecodedResponse", "decoder_problem"]

#: The most decoded bytes one answer may expand to unless the caller says (a stream of
#: ~10^6 tokens; the forwarder passes ``[defaults] max_response_bytes``).
MAX_DECODED_BYTES = 64 * 1024 * 1024
#: The most bytes one decoding step produces: what one read of the decoded body holds.
STEP_BYTES = 256 * 1024
#: zstd decodes each input slice whole (``zstandard`` has no output bound): a slice this
#: small completes at most one block (128 KiB at most, from 4 bytes or more)
_ZSTD_INPUT_BYTES = 4
#: brotli's ``output_buffer_limit`` is passed by up to one growth of its buffer (about
#: as much again): asked for this, it gives at most :data:`STEP_BYTES`
_BROTLI_LIMIT = STEP_BYTES // 4


class _TooLarge(Exception):
    """A decoder produced more than its bound."""


class _Decoder:
    """One coding undone in bounded steps: :meth:`push` gives it input (only once
    :meth:`step` returned ``b""``, everything before consumed), each :meth:`step` returns
    at most about :data:`STEP_BYTES` of output, ``b""`` when it needs more input.
    Past ``limit`` bytes produced in all: :class:`_TooLarge`."""

    def __init__(self, limit: int) -> None:
        self.produced = 0
        self._limit = limit
        self._input = b""

    def push(self, data: bytes) -> None:
        self._input = data

    def _count(self, piece: bytes) -> bytes:
        self.produced += len(piece)
        if self.produced > self._limit:
            raise _TooLarge
        return piece


class _Zlib(_Decoder):
    """gzip (``wbits`` 31, concatenated members) or deflate (zlib, else raw)."""

    def __init__(self, coding: str, limit: int) -> None:
        super().__init__(limit)
        self._gzip = coding != "deflate"
        self._obj = zlib.decompressobj(zlib.MAX_WBITS | 16 if self._gzip else zlib.MAX_WBITS)
        self._started = False
        self._full = False  # the last step filled its output: zlib may hold more

    def step(self) -> bytes:
        while self._input or self._full:
            try:
                piece = self._obj.decompress(self._input, STEP_BYTES)
            except zlib.error:
                if self._gzip or self._started:
                    raise
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, no zlib header
                self._started = True
                continue
            self._started = True
            self._full = len(piece) == STEP_BYTES
            self._input = self._obj.unconsumed_tail
            if self._obj.eof:
                self._full = False
                rest = self._obj.unused_data
                self._input = b""  # a deflate stream's end: bytes after it are ignored
                if self._gzip and rest:
                    self._obj = zlib.decompressobj(zlib.MAX_WBITS | 16)  # the next gzip member
                    self._input = rest
            if piece:
                return self._count(piece)
        return b""

    def complete(self) -> bool:
        return self._obj.eof


class _Brotli(_Decoder):
    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._obj = brotli.Decompressor()

    def step(self) -> bytes:
        while True:
            if self._input:
                data, self._input = self._input, b""
                piece = self._obj.process(data, output_buffer_limit=_BROTLI_LIMIT)
            elif not self._obj.can_accept_more_data():  # output held back: take it first
                piece = self._obj.process(b"", output_buffer_limit=_BROTLI_LIMIT)
            else:
                return b""
            if piece:
                return self._count(piece)

    def complete(self) -> bool:
        return self._obj.is_finished()


class _Zstd(_Decoder):
    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._obj = zstandard.ZstdDecompressor().decompressobj()
        self._at = 0

    def push(self, data: bytes) -> None:
        self._input, self._at = data, 0

    def step(self) -> bytes:
        view = memoryview(self._input)
        pieces: list[bytes] = []
        size = 0
        while self._at < len(view) and size < STEP_BYTES // 2:  # one more slice: at most a block more
            piece = self._obj.decompress(view[self._at : self._at + _ZSTD_INPUT_BYTES])
            self._at += _ZSTD_INPUT_BYTES
            if piece:
                pieces.append(self._count(piece))
                size += len(piece)
        if self._at >= len(view):
            self._input, self._at = b"", 0
        return b"".join(pieces)

    def complete(self) -> bool:
        return self._obj.eof


_ERRORS: tuple[type[BaseException], ...] = (zlib.error, brotli.error, zstandard.ZstdError)


def _codings(content_encoding: str) -> list[str]:
    """The codings to undo, outermost first (identity dropped), lower-case."""
    names = [part.strip().lower() for part in content_encoding.split(",")]
    return [name for name in reversed(names) if name and name != "identity"]


def _decoder(coding: str, limit: int = MAX_DECODED_BYTES) -> _Zlib | _Brotli | _Zstd | None:
    if coding in ("gzip", "x-gzip", "deflate"):
        return _Zlib(coding, limit)
    if coding == "br":
        return _Brotli(limit)
    if coding == "zstd":
        return _Zstd(limit)
    return None


def decoder_problem(content_encoding: str) -> str | None:
    """Why an answer with this ``Content-Encoding`` cannot be decoded (``None``: it can).

    Returns:
        a message naming the coding (at most 32 characters of it), for the provider's
        error; never the body.
    """
    for coding in _codings(content_encoding):
        if _decoder(coding) is None:
            return f"answered with content encoding {coding[:32]!r}, which latgate cannot decode"
    return None


class DecodedResponse(SelfIteratingBody):
    """An upstream response whose body is decoded on the way: an
    :class:`~latgate.transport.upstream.UpstreamResponse` over the undecoded one's parts.

    Each read gives at most about :data:`STEP_BYTES` of decoded body, and the next
    compressed read is taken only once the last one is decoded: a small compressed
    read that expands a lot (a bomb) costs one step's memory at a time and one step's
    CPU between two reads of the event loop, and the bound stops it as soon as it is
    passed.

    Args:
        status_code, headers, followed: the undecoded response's.
        body: its body as it arrives (encoded).
        close, close_connection: its ``aclose`` and ``close_connection``.
        content_encoding: its ``Content-Encoding``, checked by :func:`decoder_problem`.
        max_decoded_bytes: the most bytes the body may decode to (each coding's output
            counts: a bomb inside another is stopped at the inner one).

    Raises (while iterating):
        UpstreamFailure: ``read`` when the body does not decode or ends before the
            compressed stream does; ``too_large`` when it decodes past
            ``max_decoded_bytes``.
    """

    __slots__ = (
        "_close", "_close_connection", "_decoders", "_finished", "_limit", "_raw", "followed", "headers", "status_code",
    )  # fmt: skip

    def __init__(
        self,
        *,
        status_code: int,
        headers: Mapping[str, str],
        body: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        close_connection: Callable[[], None],
        content_encoding: str,
        max_decoded_bytes: int = MAX_DECODED_BYTES,
        followed: str | None = None,
    ) -> None:
        self.status_code = status_code
        self.headers = headers
        self.followed = followed  # the redirect followed to get it
        self._raw = body
        self._close = close
        self._close_connection = close_connection
        self._limit = max_decoded_bytes
        decoders = [_decoder(coding, max_decoded_bytes) for coding in _codings(content_encoding)]
        if None in decoders:
            raise ValueError(f"cannot decode {content_encoding!r}: check decoder_problem first")
        self._decoders = [decoder for decoder in decoders if decoder is not None]
        self._finished = False

    async def __anext__(self) -> bytes:
        try:
            while True:
                out = self._pull(len(self._decoders) - 1)
                if out:
                    return out
                if self._finished:
                    raise StopAsyncIteration
                try:
                    data = await anext(self._raw)
                except StopAsyncIteration:
                    self._finished = True
                    if not all(decoder.complete() for decoder in self._decoders):
                        raise UpstreamFailure("read", "the upstream's compressed body ended early") from None
                    raise
                if self._decoders:
                    self._decoders[0].push(data)
                elif data:
                    return data
        except _ERRORS:
            raise UpstreamFailure("read", "the upstream's compressed body is malformed") from None
        except _TooLarge:
            raise UpstreamFailure("too_large", f"the upstream's body decodes to more than {self._limit} bytes") from None

    def _pull(self, index: int) -> bytes:
        """One step of decoder ``index``'s output (those before it fed as it needs);
        ``b""`` when the raw body must be read on."""
        if index < 0:
            return b""
        decoder = self._decoders[index]
        while True:
            out = decoder.step()
            if out:
                return out
            more = self._pull(index - 1)
            if not more:
                return b""
            decoder.push(more)

    async def aclose(self) -> None:
        await self._close()

    def close_connection(self) -> None:
        self._close_connection()
