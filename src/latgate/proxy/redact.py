"""Removing what must never reach a client from upstream text: internal URLs, bearer
tokens and the provider's own key (an upstream may echo what it was sent)."""

from __future__ import annotations

import re

_URL = re.compile(rb"https?://[^\s\"'<>]+")
_BEARER = re.compile(rb"(?i)bearer\s+[^\s\"',;]+")


def redact(data: bytes, secrets: tuple[bytes, ...] = ()) -> bytes:
    """``data`` with each of ``secrets`` replaced by ``<redacted>``, any ``Bearer TOKEN``
    by ``Bearer <redacted>`` and any http(s) URL by ``<upstream-url>``."""
    for secret in secrets:
        if secret:
            data = data.replace(secret, b"<redacted>")
    data = _BEARER.sub(b"Bearer <redacted>", data)
    return _URL.sub(b"<upstream-url>", data)


def redact_text(text: str, secrets: tuple[bytes, ...] = ()) -> str:
    """:func:`redact` for ``str``."""
    return redact(text.encode("utf-8", "replace"), secrets).decode("utf-8", "replace")
