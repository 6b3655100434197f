"""Removing what must never reach a client from upstream text: internal URLs and
addresses, bearer tokens, the provider's own key (an upstream may echo what it was
sent), anything else that looks like a key, and stack traces."""

from __future__ import annotations

import re

from latgate.config.masking import mask_secrets

_URL = re.compile(rb"https?://[^\s\"'<>]+")
_BEARER = re.compile(rb"(?i)bearer\s+[^\s\"',;]+")
#: an IPv4 address (with or without a port), or a host name or bracketed IPv6 address with a port
_ADDRESS = re.compile(
    rb"(?<![\w.])(?:\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?"
    rb"|(?:\[[0-9A-Fa-f:.]+\]|localhost|(?:[A-Za-z0-9-]+\.)+[A-Za-z][A-Za-z0-9-]*):\d{1,5})(?![\w.])"
)
#: where a Python traceback starts: it and all that follows are dropped from a message
_TRACEBACK = "Traceback (most recent call last)"


def redact(data: bytes, secrets: tuple[bytes, ...] = ()) -> bytes:
    """``data`` with each of ``secrets`` replaced by ``<redacted>``, any ``Bearer TOKEN``
    by ``Bearer <redacted>``, any http(s) URL by ``<upstream-url>`` and any IP address
    or ``host:port`` by ``<address>``. Each replacement is plain ASCII without quotes or
    backslashes, so a JSON document stays one."""
    for secret in secrets:
        if secret:
            data = data.replace(secret, b"<redacted>")
    data = _BEARER.sub(b"Bearer <redacted>", data)
    data = _URL.sub(b"<upstream-url>", data)
    return _ADDRESS.sub(b"<address>", data)


def redact_text(text: str, secrets: tuple[bytes, ...] = ()) -> str:
    """An upstream-authored message as a client may see it: :func:`redact`, then every
    word that looks like a key masked (:func:`latgate.config.masking.mask_secrets`,
    ``sk-proj-...`` -> ``sk-***``), and a Python traceback and all after it replaced by
    ``(traceback removed)``."""
    cut = text.find(_TRACEBACK)
    if cut >= 0:
        text = text[:cut].rstrip() + " (traceback removed)"
    return mask_secrets(redact(text.encode("utf-8", "replace"), secrets).decode("utf-8", "replace"))
