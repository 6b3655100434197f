"""Parsing the request headers routing reads (docs/routing.md, "Headers").

Each parser raises :class:`~latgate.foundation.errors.InvalidRequest` naming the header for a value
that cannot mean anything, so a client learns of its mistake instead of being routed by
a guess.
"""

from __future__ import annotations

import re

from latgate.foundation.errors import InvalidRequest
from latgate.routing.sessions import GENERIC_SESSION_HEADER, SESSION_HEADERS

_TRUE_VALUES = ("1", "true", "yes", "on")
_FALSE_VALUES = ("0", "false", "no", "off")
#: every value ``X-Latency-Sensitive`` accepts, for its error message
_FLAG_VALUES_TEXT = ", ".join((*_TRUE_VALUES, *_FALSE_VALUES)[:-1]) + f" or {_FALSE_VALUES[-1]}"
_DIGITS = re.compile(r"[0-9]{1,12}")


#: A header value shown in an error message is cut to this many characters.
SHOWN_VALUE_CHARS = 40


def shown_value(value: str) -> str:
    """A request header value for an error message: its bytes (the server hands them on
    as latin-1) read as UTF-8, cut to :data:`SHOWN_VALUE_CHARS` characters, quoted
    with control characters escaped (``repr``)."""
    try:
        text = value.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:  # already decoded text
        text = value
    if len(text) > SHOWN_VALUE_CHARS:
        return repr(text[:SHOWN_VALUE_CHARS]) + f"... ({len(text)} characters)"
    return repr(text)


def flag_header(value: str | None) -> bool:
    """``X-Latency-Sensitive``: 1/true/yes/on or 0/false/no/off (absent or empty: false)."""
    if value is None:
        return False
    text = value.strip().lower()
    if text in _TRUE_VALUES:
        return True
    if text in _FALSE_VALUES or not text:
        return False
    raise InvalidRequest(
        f"X-Latency-Sensitive must be {_FLAG_VALUES_TEXT}, not {shown_value(value)}",
        param="X-Latency-Sensitive", code="invalid_header_value",
    )


def debug_header(value: str | None) -> bool:
    """``X-Latgate-Debug``: true for 1/true/yes/on, anything else false."""
    return value is not None and value.strip().lower() in _TRUE_VALUES


def budget_header(value: str | None) -> int | None:
    """``X-Latency-Budget-Ms``: a whole number of milliseconds, or None when absent."""
    if value is None:
        return None
    text = value.strip()
    if not _DIGITS.fullmatch(text):
        raise InvalidRequest(
            f"X-Latency-Budget-Ms must be a non-negative whole number of milliseconds, not {shown_value(value)}",
            param="X-Latency-Budget-Ms", code="invalid_header_value",
        )
    return int(text)


#: The request headers latgate acts on (authentication, routing, sessions, the body's
#: media type, the request's id), by lowercase name, with the spelling an error names:
#: each must come once. (``traceparent`` is not here: a trace context latgate cannot
#: read starts a new trace, it refuses nothing.)
ACTED_ON_HEADERS = {
    b"authorization": "Authorization",
    b"x-api-key": "x-api-key",
    b"x-latency-budget-ms": "X-Latency-Budget-Ms",
    b"x-latency-sensitive": "X-Latency-Sensitive",
    b"x-route-to": "X-Route-To",
    b"x-route-policy": "X-Route-Policy",
    b"x-latgate-debug": "X-Latgate-Debug",
    b"x-request-id": "X-Request-Id",
    b"x-latgate-priority": "X-Latgate-Priority",
    b"content-type": "Content-Type",
    b"content-encoding": "Content-Encoding",
    **{name.encode(): name for name in SESSION_HEADERS},
    GENERIC_SESSION_HEADER.encode(): "X-Session-Id",
}


def refuse_duplicate_headers(raw_headers: list[tuple[bytes, bytes]]) -> None:
    """Raise :class:`~latgate.foundation.errors.InvalidRequest` (400, code ``duplicate_header``,
    param the header) when one of :data:`ACTED_ON_HEADERS` comes more than once in
    ``raw_headers`` (an ASGI scope's, lowercase names): which one latgate should act on
    would be a guess (the first, for most frameworks; the last, for some proxies)."""
    seen: set[bytes] = set()
    for name, _ in raw_headers:
        if name in ACTED_ON_HEADERS:
            if name in seen:
                shown = ACTED_ON_HEADERS[name]
                raise InvalidRequest(
                    f"the {shown} header was sent more than once; send it once", param=shown, code="duplicate_header"
                )
            seen.add(name)
