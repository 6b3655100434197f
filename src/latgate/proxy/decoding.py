"""Compressed upstream answers, decoded as they arrive.

latgate asks every upstream for ``Accept-Encoding: identity``, but some servers, CDNs
and gateways compress whatever the request says. Such an answer is a well-formed one:
:class:`DecodedResponse` wraps it and hands on the decoded body, chunk by chunk, with
the decoded size bounded (:data:`MAX_DECODED_BYTES`, and each step's output bounded so
a small compressed chunk cannot expand into a large buffer at once).

Codings (RFC 9110 section 8.4.1, applied in the order listed, so decoded in reverse):
``gzip`` / ``x-gzip`` (RFC 1952, several members allowed), ``deflate`` (RFC 1950 zlib;
a raw RFC 1951 stream is accepted too, as browsers and httpx do), ``br`` (RFC 7932,
the ``brotli`` package) and ``zstd`` (RFC 8878, the ``zstandard`` package), ``identity``.
A body that does not decode, or ends mid-stream, is the provider's failure
(:class:`~latgate.proxy.errors.UpstreamFailure` ``read``); a coding latgate cannot
decode is refused before the body is read (:func:`decoder_problem`).
"""

from __future__ import annotations

import zlib
from typing import Any

from latgate.proxy.errors import UpstreamFailure

try:
    import brotli
except ImportError:  # pragma: no cover - a dependency; kept optional for slim installs
    brotli = None
try:
    import zstandard
except ImportError:  # pragma: no cover
    zstandard = None

__all__ = ["MAX_DECODED_BYTES", "DecodedResponse", "decoder_problem"]

#: The most decoded bytes one answer may expand to (a stream of ~10^6 tokens).
MAX_DECODED_BYTES = 64 * 1024 * 1024
#: The most bytes one decoding step produces before the size check.
_STEP_BYTES = 256 * 1024
#: zstd decodes each input slice whole: slices this small bound its output per step.
_ZSTD_INPUT_BYTES = 256


class _TooLarge(Exception):
    """A decoder produced more than :data:`MAX_DECODED_BYTES`."""


class _Decoder:
    """Counts what a decoder produced; past the bound, :class:`_TooLarge`."""

    produced = 0

    def _count(self, piece: bytes) -> bytes:
        self.produced += len(piece)
        if self.produced > MAX_DECODED_BYTES:
            raise _TooLarge
        return piece


class _Zlib(_Decoder):
    """gzip (``wbits`` 31, concatenated members) or deflate (zlib, else raw)."""

    def __init__(self, coding: str) -> None:
        self._gzip = coding != "deflate"
        self._obj = zlib.decompressobj(zlib.MAX_WBITS | 16 if self._gzip else zlib.MAX_WBITS)
        self._started = False

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        while data:
            try:
                piece = self._obj.decompress(data, _STEP_BYTES)
            except zlib.error:
                if self._gzip or self._started:
                    raise
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, no zlib header
                self._started = True
                continue
            self._started = True
            if piece:
                out.append(self._count(piece))
            data = self._obj.unconsumed_tail
            if self._obj.eof:
                rest = self._obj.unused_data
                if not (self._gzip and rest):
                    break  # a deflate stream's end; bytes after it are ignored
                self._obj = zlib.decompressobj(zlib.MAX_WBITS | 16)  # the next gzip member
                data = rest
        return out

    def complete(self) -> bool:
        return self._obj.eof


class _Brotli(_Decoder):
    def __init__(self) -> None:
        self._obj = brotli.Decompressor()

    def feed(self, data: bytes) -> list[bytes]:
        out = [self._count(self._obj.process(data, output_buffer_limit=_STEP_BYTES))]
        while not self._obj.can_accept_more_data():
            out.append(self._count(self._obj.process(b"", output_buffer_limit=_STEP_BYTES)))
        return out

    def complete(self) -> bool:
        return self._obj.is_finished()


class _Zstd(_Decoder):
    def __init__(self) -> None:
        self._obj = zstandard.ZstdDecompressor().decompressobj()

    def feed(self, data: bytes) -> list[bytes]:
        view = memoryview(data)
        return [
            self._count(self._obj.decompress(view[i : i + _ZSTD_INPUT_BYTES]))
            for i in range(0, len(view), _ZSTD_INPUT_BYTES)
        ]

    def complete(self) -> bool:
        return self._obj.eof


_ERRORS: tuple[type[BaseException], ...] = (zlib.error,) + ((brotli.error,) if brotli else ()) + (
    (zstandard.ZstdError,) if zstandard else ()
)


def _codings(content_encoding: str) -> list[str]:
    """The codings to undo, outermost first (identity dropped), lower-case."""
    names = [part.strip().lower() for part in content_encoding.split(",")]
    return [name for name in reversed(names) if name and name != "identity"]


def _decoder(coding: str) -> Any:
    if coding in ("gzip", "x-gzip", "deflate"):
        return _Zlib(coding)
    if coding == "br" and brotli is not None:
        return _Brotli()
    if coding == "zstd" and zstandard is not None:
        return _Zstd()
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


class DecodedResponse:
    """An upstream response whose body is decoded on the way (the same slice of
    ``httpx.Response`` the forwarder reads: ``status_code``, ``headers``,
    ``aiter_raw()``, ``aread()``, ``aclose()``).

    Args:
        response: the undecoded response (its ``aiter_raw`` gives the encoded body).
        content_encoding: its ``Content-Encoding``, checked by :func:`decoder_problem`.

    Raises (while iterating):
        UpstreamFailure: ``read`` when the body does not decode, ends before the
            compressed stream does, or decodes past :data:`MAX_DECODED_BYTES`.
    """

    __slots__ = ("_decoders", "_finished", "_raw", "_response", "followed", "headers", "status_code")

    def __init__(self, response: Any, content_encoding: str) -> None:
        self._response = response
        self.followed: str | None = getattr(response, "followed", None)  # the redirect followed to get it
        self._raw = response.aiter_raw()
        self._decoders = [_decoder(coding) for coding in _codings(content_encoding)]
        self._finished = False
        self.status_code = response.status_code
        self.headers = response.headers

    def aiter_raw(self) -> DecodedResponse:
        return self

    def __aiter__(self) -> DecodedResponse:
        return self

    async def __anext__(self) -> bytes:
        while not self._finished:
            try:
                data = await anext(self._raw)
            except StopAsyncIteration:
                self._finished = True
                if not all(decoder.complete() for decoder in self._decoders):
                    raise UpstreamFailure("read", "the upstream's compressed body ended early") from None
                raise
            out = self._decode(data)
            if out:
                return out
        raise StopAsyncIteration

    def _decode(self, data: bytes) -> bytes:
        pieces = [data]
        try:
            for decoder in self._decoders:
                pieces = [out for piece in pieces if piece for out in decoder.feed(piece)]
        except _ERRORS:
            raise UpstreamFailure("read", "the upstream's compressed body is malformed") from None
        except _TooLarge:
            raise UpstreamFailure("too_large", f"the upstream's body decodes to more than {MAX_DECODED_BYTES} bytes") from None
        return b"".join(pieces)

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self])

    async def aclose(self) -> None:
        await self._response.aclose()
