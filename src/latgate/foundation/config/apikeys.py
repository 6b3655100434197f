"""Provider keys: the value of an ``api_key_env`` variable as it can be sent upstream.

A key travels as ``Authorization: Bearer KEY``, and an HTTP header value is visible
ASCII, spaces and tabs only (RFC 9110, section 5.5). A key read from a file often ends
in a newline; a pasted one may carry a non-breaking space. :func:`header_key` is the
one rule for what is sent, :func:`key_problem` the start-up warning that explains it.
Neither ever puts the key itself in a message.
"""

from __future__ import annotations

_VISIBLE_ASCII = frozenset(chr(c) for c in range(0x21, 0x7F))


def header_key(value: str) -> str:
    """The key to send for the variable's ``value``, or ``""`` to send none.

    Surrounding whitespace is removed. A key that still holds anything but visible
    ASCII (a control character such as an inner CR/LF, a space, a non-ASCII letter)
    cannot be a working key and could split the header: none is sent, so the upstream
    answers 401 (which the gateway reports) instead of every request failing.

    Example::

        header_key("sk-abc\\n")        # 'sk-abc'
        header_key("sk-a\\r\\nX: 1")    # ''
    """
    key = value.strip()
    return key if all(c in _VISIBLE_ASCII for c in key) else ""


def key_problem(value: str) -> str | None:
    """What is wrong with a key variable's ``value``, as the end of a warning, or None.

    It follows ``api_key_env NAME`` and names no character of the key. Example:
    ``"is set but empty; ..."``.
    """
    key = value.strip()
    if not key:
        return "is set but empty; requests to it will be sent without a key (expect 401 from the upstream)"
    if not header_key(value):
        return (
            "is set, but its value holds a space, control or non-ASCII character, which an HTTP "
            "header cannot carry; requests to it will be sent without a key (expect 401 from the upstream)"
        )
    if key != value:
        return "is set, but its value has whitespace around the key (a trailing newline?); it is removed before sending"
    return None
