"""Bounded request heads: uvicorn's httptools protocol with limits on the request line
and header fields.

uvicorn's httptools protocol (the fast one latgate serves with) buffers a request head
of any size: a client could send megabytes of headers, or one endless header, and the
server would keep them all. Here the head is bounded before any of it reaches the app:

- ``MAX_HEAD_BYTES``: request line plus all header fields;
- ``MAX_FIELD_BYTES``: one header field (name and value);
- ``MAX_FIELDS``: the number of header fields.

Over a limit, the client gets ``431 Request Header Fields Too Large`` (RFC 6585 section
5) with an OpenAI error envelope, and the connection is closed. Two checks: exact
sizes from the parser's callbacks (a head sent in one piece), and the raw bytes
received while the head is still incomplete (a head that never ends, which the parser
buffers without calling back). Pass the class as ``uvicorn.Config(http=...)``; under
h11 (the pure-Python protocol, e.g. in tests) ``h11_max_incomplete_event_size`` gives a
head limit instead (400).

Cost per request: three counter updates in callbacks uvicorn already makes.
"""

from __future__ import annotations

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
MAX_FIELD_BYTES = 16 * 1024
MAX_FIELDS = 100


class _HeadTooLarge(Exception):
    pass


def _refusal(reason: str) -> bytes:
    body = orjson.dumps(
        {
            "error": {
                "message": f"request head too large: {reason}",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_header_fields_too_large",
            }
        }
    )
    head = (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n"
    )
    return head + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded request heads (module docstring)."""

    _in_head = True
    _raw_head_bytes = 0
    _parsed_head_bytes = 0
    _fields = 0
    _too_large: str | None = None

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._raw_head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._raw_head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._refuse(f"more than {MAX_HEAD_BYTES} bytes")

    def on_message_begin(self) -> None:
        self._in_head = True
        self._parsed_head_bytes = 0
        self._fields = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._parsed_head_bytes += len(url)
        if self._parsed_head_bytes > MAX_HEAD_BYTES:
            self._too_large = f"more than {MAX_HEAD_BYTES} bytes"
            raise _HeadTooLarge
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        self._parsed_head_bytes += size + 4
        self._fields += 1
        if size > MAX_FIELD_BYTES:
            self._too_large = f"a header field of more than {MAX_FIELD_BYTES} bytes"
        elif self._fields > MAX_FIELDS:
            self._too_large = f"more than {MAX_FIELDS} header fields"
        elif self._parsed_head_bytes > MAX_HEAD_BYTES:
            self._too_large = f"more than {MAX_HEAD_BYTES} bytes"
        if self._too_large is not None:
            raise _HeadTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        self._raw_head_bytes = 0
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers any parser error with 400; a callback refusing the head
        # surfaces as one, and becomes the 431 it is.
        if self._too_large is None:
            super().send_400_response(msg)
        else:
            self._refuse(self._too_large)

    def _refuse(self, reason: str) -> None:
        self.transport.write(_refusal(reason))
        self.transport.close()
