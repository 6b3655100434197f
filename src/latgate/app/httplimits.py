"""Client connections held to limits: bounded request heads, client-side timeouts and a
connection cap, on uvicorn's httptools protocol (the fast one latgate serves with).

uvicorn's httptools protocol buffers a request head of any size and waits for a client
for as long as it likes. Here, before anything reaches the app:

- **Head size**: ``MAX_HEAD_BYTES`` (request line plus header fields),
  ``MAX_FIELD_BYTES`` (one field), ``MAX_FIELDS``; over a limit the client gets
  ``431 Request Header Fields Too Large`` (RFC 6585 section 5). Two checks: exact sizes
  from the parser's callbacks, and the raw bytes of a head that never ends.
- **Head time** (``[server] header_timeout_sec``): a connection must deliver a complete
  request head this long after it opened (or after the first byte of a later request on
  a kept-alive connection); else ``408 Request Timeout`` and the connection is closed.
  This closes idle connections that never send anything and slowloris heads.
- **Body gaps** (``body_timeout_sec``): the longest silence while a request body is
  being received (not counted while latgate itself has paused reading). Past it: 408
  if no response began, the connection is closed, and the app sees the client gone.
- **Unread responses** (``send_timeout_sec``): the longest a client may leave written
  bytes unread once the write buffer is full (the transport paused writing). Past it
  the connection is aborted; the stream relay sees the client gone and closes the
  upstream.
- **Connection cap** (``max_connections``): a connection beyond it gets ``503`` with
  ``connection: close`` once its head arrived, and a (rate-limited) warning line,
  never a silent close.
- A malformed request head gets ``400`` in the OpenAI envelope; a request line of
  another HTTP version than 1.0 or 1.1 (an HTTP/0.9 ``GET /path`` without one) gets
  ``505``, an ``Expect`` other than ``100-continue`` ``417`` (RFC 9110 section 10.1.1).
- **Request transfer codings**: ``chunked`` is the only one latgate decodes; a
  request declaring another (``Transfer-Encoding: gzip, chunked``: llhttp dechunks it
  and would hand on the gzip bytes as the body) gets ``501 Not Implemented`` (RFC 9112
  section 6.1) in the envelope of the API at its path, recorded as
  ``unsupported_transfer_coding``.
- **HTTP/1.0 clients**: a response without ``Content-Length`` (a stream) is sent
  close-delimited, never chunked (RFC 9112 sections 6.1 and 6.3: HTTP/1.0 has no
  chunked coding; uvicorn chunks whatever the request's version):
  :class:`~latgate.app.http10.Http10Cycle`.

These are the nginx ``client_header_timeout`` / ``client_body_timeout`` /
``send_timeout`` (408) of the reference servers. Every refusal written here is an
OpenAI error envelope with ``connection: close``; timeouts met during a request put
their kind in the ASGI scope under :data:`~latgate.foundation.scope_keys.TIMEOUT_SCOPE_KEY`, so the app records the
request (access line and metric) with it. Refusals before any request reached the app
are recorded through :attr:`ClientLimits.on_refused`.

Pass :func:`client_protocol`'s class as ``uvicorn.Config(http=...)``; under h11 (the
pure-Python protocol, e.g. in tests) ``h11_max_incomplete_event_size`` gives a head
limit instead (400) and none of the timeouts apply.

The subclass reaches into uvicorn's private protocol (it replaces ``data_received`` and
``send_400_response``, reads about ten private members): ``pyproject.toml`` pins uvicorn
to the minor release this was audited on, and ``tests/test_uvicorn_contract.py`` fails,
naming the method, when an installed uvicorn differs from it.

Cost per request: a few counter updates in callbacks uvicorn already makes; one timer
per connection (the head), one per request only when its body arrives in several reads.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from latgate.app.client_limits import (
    MAX_FIELD_BYTES,
    MAX_FIELDS,
    MAX_HEAD_BYTES,
    ClientLimits,
    ErrorAnswer,
    envelope,
    openai_error_body,
)
from latgate.app.http10 import Http10Cycle
from latgate.foundation.scope_keys import REQUEST_ID_SCOPE_KEY, TIMEOUT_SCOPE_KEY

__all__ = [
    "MAX_FIELDS",
    "MAX_FIELD_BYTES",
    "MAX_HEAD_BYTES",
    "BoundedHttpToolsProtocol",
    "ClientLimits",
    "ErrorAnswer",
    "client_protocol",
    "envelope",
    "openai_error_body",
]

#: At most one "connection limit reached" warning per this many seconds.
CAP_LOG_INTERVAL_SECONDS = 1.0

log = logging.getLogger("latgate")


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; the refusal is on the protocol."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of :attr:`limits` (module docstring)."""

    limits = ClientLimits()
    _cap_refused = 0
    _cap_logged_at = 0.0

    _in_head = True
    _raw_head_bytes = 0
    _parsed_head_bytes = 0
    _fields = 0
    _refusal: tuple[int, str, bytes] | None = None  # (status, kind, response bytes)
    _coding: bytes | None = None  # a request transfer coding other than chunked
    _over_cap = False
    _head_timer = None
    _body_timer = None
    _send_timer = None
    _last_body_at = 0.0

    # --- connection ------------------------------------------------------------------

    # Transport, not asyncio's BaseTransport: the signature of uvicorn's method (which
    # ignores the same error); a stream server hands its protocol a Transport
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        if limits.max_connections is not None and len(self.connections) > limits.max_connections:
            self._over_cap = True
        if limits.header_timeout_sec is not None:
            self._head_timer = self.loop.call_later(limits.header_timeout_sec, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._in_head:
            self._raw_head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if self._refusal is None:
                self._refusal = (
                    400,
                    "malformed_head",
                    envelope(400, "Bad Request", "malformed HTTP request", code="malformed_request"),
                )
            self._refuse()
            return
        if self.transport.is_closing():
            return
        if self._in_head:
            if self._raw_head_bytes > MAX_HEAD_BYTES:
                self._too_large(f"more than {MAX_HEAD_BYTES} bytes")
                self._refuse()
            elif self._raw_head_bytes and self._head_timer is None and self.limits.header_timeout_sec is not None:
                # the first bytes of a later request on a kept-alive connection
                self._head_timer = self.loop.call_later(self.limits.header_timeout_sec, self._head_timed_out)
        elif self.cycle is not None and self.cycle.more_body:
            self._last_body_at = self.loop.time()
            if self._body_timer is None and self.limits.body_timeout_sec is not None:
                self._body_timer = self.loop.call_later(self.limits.body_timeout_sec, self._body_timed_out)

    # --- parser callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._parsed_head_bytes = 0
        self._fields = 0
        self._coding = None
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._parsed_head_bytes += len(url)
        if self._parsed_head_bytes > MAX_HEAD_BYTES:
            self._too_large(f"more than {MAX_HEAD_BYTES} bytes")
            raise _Refused
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        self._parsed_head_bytes += size + 4
        self._fields += 1
        if size > MAX_FIELD_BYTES:
            self._too_large(f"a header field of more than {MAX_FIELD_BYTES} bytes")
        elif self._fields > MAX_FIELDS:
            self._too_large(f"more than {MAX_FIELDS} header fields")
        elif self._parsed_head_bytes > MAX_HEAD_BYTES:
            self._too_large(f"more than {MAX_HEAD_BYTES} bytes")
        if self._refusal is not None:
            raise _Refused
        if len(name) == 6 and name.lower() == b"expect" and value.strip().lower() != b"100-continue":
            shown = value[:32].decode("latin-1").encode("ascii", "backslashreplace").decode("ascii")
            message = f"Expect {shown!r} cannot be met: only 100-continue is"
            self._refusal = (417, "malformed_head", envelope(417, "Expectation Failed", message, code="expectation_failed"))
            raise _Refused
        if len(name) == 17 and name.lower() == b"transfer-encoding":
            for coding in value.lower().split(b","):
                if coding.strip() != b"chunked" and self._coding is None:
                    self._coding = coding.strip()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._over_cap:
            self._refuse_over_cap()
            raise _Refused
        if self._coding is not None:
            self._refuse_coding(self._coding)
            raise _Refused
        version = self.parser.get_http_version()
        if version != "1.1" and version != "1.0":
            message = f"HTTP/{version} is not supported: send HTTP/1.1 (or 1.0)"
            self._refusal = (505, "malformed_head", envelope(505, "HTTP Version Not Supported", message, code="http_version_not_supported"))
            raise _Refused
        super().on_headers_complete()
        if self.scope["http_version"] == "1.0" and self.cycle is not None and self.cycle.scope is self.scope:
            self.cycle.__class__ = Http10Cycle  # its task has not run yet: its sends are ours

    def on_message_complete(self) -> None:
        self._in_head = True
        self._raw_head_bytes = 0
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    # --- writing ------------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.limits.send_timeout_sec is not None and self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_sec, self._send_timed_out)

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's plain-text 400 for a parser error: the OpenAI envelope instead
        if self._refusal is None:
            self._refusal = (400, "malformed_head", envelope(400, "Bad Request", "malformed HTTP request", code="malformed_request"))
        self._refuse()

    # --- timeouts -----------------------------------------------------------------------

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        seconds = self.limits.header_timeout_sec
        self._refusal = (
            408,
            "header_timeout",
            envelope(408, "Request Timeout", f"no complete request head within {seconds:g} s", code="request_timeout"),
        )
        self._refuse()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or not cycle.more_body:
            return
        seconds = self.limits.body_timeout_sec
        assert seconds is not None
        due = self._last_body_at + seconds
        if self.flow.read_paused:  # latgate is not reading: not the client's gap
            self._last_body_at = self.loop.time()
            self._body_timer = self.loop.call_later(seconds, self._body_timed_out)
            return
        if self.loop.time() < due:  # bytes came since the timer was set
            self._body_timer = self.loop.call_at(due, self._body_timed_out)
            return
        # uvicorn types the scope as its HTTPScope TypedDict; ASGI lets a server add keys
        cycle.scope[TIMEOUT_SCOPE_KEY] = "body_timeout"  # type: ignore[literal-required]
        if not cycle.response_started:
            message = f"request body stalled for {seconds:g} s"
            request_id = cycle.scope.get(REQUEST_ID_SCOPE_KEY)
            if not isinstance(request_id, str):  # the app had not named the request yet
                request_id = "-"
            body, headers = self.limits.error_body(cycle.scope["path"], 408, message, "request_timeout", request_id)
            answer = envelope(408, "Request Timeout", message, code="request_timeout", body=body, headers=headers)
            self.transport.write(answer)
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()

    def _send_timed_out(self) -> None:
        self._send_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None:
            # a key of latgate's in uvicorn's HTTPScope TypedDict, as in _body_timed_out
            self.cycle.scope[TIMEOUT_SCOPE_KEY] = "send_timeout"  # type: ignore[literal-required]
        self.transport.abort()  # close() would wait to flush bytes the client never reads

    # --- refusals -----------------------------------------------------------------------

    def _too_large(self, reason: str) -> None:
        self._refusal = (
            431,
            "head_too_large",
            envelope(
                431,
                "Request Header Fields Too Large",
                f"request head too large: {reason}",
                code="request_header_fields_too_large",
            ),
        )

    def _refuse_over_cap(self) -> None:
        cls = type(self)
        cls._cap_refused += 1
        now = time.monotonic()
        if now - cls._cap_logged_at >= CAP_LOG_INTERVAL_SECONDS:
            log.warning(
                "connection limit reached ([server] max_connections = %d): answered %d connection(s) with 503",
                self.limits.max_connections,
                cls._cap_refused,
            )
            cls._cap_logged_at = now
            cls._cap_refused = 0
        self._refusal = (
            503,
            "connection_limit",
            envelope(
                503,
                "Service Unavailable",
                "latgate is at its connection limit; retry shortly",
                code="overloaded",
                kind="api_error",
            ),
        )

    def _refuse_coding(self, coding: bytes) -> None:
        """501 for a request transfer coding latgate does not decode, in the envelope of
        the API at the request's path (recorded first, its id in the answer)."""
        path = httptools.parse_url(self.url).path.decode("latin-1") or "/"
        shown = coding.decode("latin-1")[:32].encode("ascii", "backslashreplace").decode("ascii")
        message = f"transfer coding {shown!r} is not supported: send the body as it is (Content-Length or chunked)"
        self._cancel_timers()
        request_id = self.limits.on_refused(501, "unsupported_transfer_coding", path) or "-"
        body, headers = self.limits.error_body(path, 501, message, "unsupported_transfer_encoding", request_id)
        self.transport.write(envelope(501, "Not Implemented", message, code="", body=body, headers=headers))
        self.transport.close()

    def _refuse(self) -> None:
        if self.transport.is_closing() or self._refusal is None:
            return
        status, kind, response = self._refusal
        path = self.scope.get("path", "") if self.scope is not None else ""
        self._cancel_timers()
        request_id = self.limits.on_refused(status, kind, path or "-")  # recorded before the client sees it
        if request_id is not None:  # the id of its access line
            status_line, _, rest = response.partition(b"\r\n")
            response = b"%s\r\nx-request-id: %s\r\n%s" % (status_line, request_id.encode(), rest)
        self.transport.write(response)
        self.transport.close()

    def _cancel_timers(self) -> None:
        for name in ("_head_timer", "_body_timer", "_send_timer"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)


def client_protocol(limits: ClientLimits) -> type[BoundedHttpToolsProtocol]:
    """The protocol class enforcing ``limits``, for ``uvicorn.Config(http=...)``."""
    return type("LatgateHttpProtocol", (BoundedHttpToolsProtocol,), {"limits": limits, "_cap_refused": 0})
