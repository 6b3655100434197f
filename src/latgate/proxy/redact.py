"""Removing what must never reach a client from upstream text: internal URLs and
addresses, bearer tokens, the provider's own key (an upstream may echo what it was
sent), anything else that looks like a key, and stack traces.

The provider's key is found in every form an upstream may write it in: as is, with
any of its characters JSON-escaped (``\\/`` as PHP's ``json_encode`` and several Java
encoders write ``/``, ``\\u002f``, ``\\"``; escaped once more inside an embedded JSON
string), percent-encoded (``%2F``), and cut short: any prefix of at least
:data:`MIN_KEY_PREFIX_CHARS` characters (``Incorrect API key provided: sk-proj-AbCd...``).
A key shorter than that is redacted only where it stands as a word of its own, so a
one-character key does not blank out every word holding that letter. Used on error
paths only (an error status's body, an error event), never per chunk.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from latgate.config.masking import mask_secrets

REDACTED = "<redacted>"
#: the shortest prefix of the provider's key that is redacted when an upstream echoes it
#: (enough to narrow a key search; vendor prefixes such as ``sk-proj-`` are this long)
MIN_KEY_PREFIX_CHARS = 8

_URL = re.compile(r"https?://[^\s\"'<>]+")
_BEARER = re.compile(r"(?i)bearer\s+[^\s\"',;]+")
#: an IPv4 address (with or without a port), or a host name or bracketed IPv6 address with a port
_ADDRESS = re.compile(
    r"(?<![\w.])(?:\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?"
    r"|(?:\[[0-9A-Fa-f:.]+\]|localhost|(?:[A-Za-z0-9-]+\.)+[A-Za-z][A-Za-z0-9-]*):\d{1,5})(?![\w.])"
)
#: where a Python traceback starts: it and all that follows are dropped from a message
_TRACEBACK = "Traceback (most recent call last)"


def _hex_either_case(value: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in value)


@functools.lru_cache(maxsize=256)
def _char_forms(char: str) -> str:
    """A pattern matching ``char`` as written, JSON-escaped (``\\uXXXX``, and ``\\/``
    ``\\"`` ``\\\\`` for those three; with any number of backslashes, for JSON inside a
    JSON string) or percent-encoded."""
    code = ord(char)
    forms = [re.escape(char), r"(?:\\)+u" + _hex_either_case(f"{code:04x}")]
    if char in '/"\\':
        forms.append(r"(?:\\)+" + re.escape(char))
    if code < 0x80:
        forms.append("%" + _hex_either_case(f"{code:02x}"))
    return "(?:" + "|".join(forms) + ")"


@functools.lru_cache(maxsize=16)  # one or two keys per provider
def _key_patterns(secret: str) -> tuple[re.Pattern[str], tuple[re.Pattern[str], ...]]:
    """(the pattern of the key's shortest redacted prefix, one pattern per further
    character): a match of the first, extended as far as the rest of the key goes."""
    if len(secret) < MIN_KEY_PREFIX_CHARS:  # a short key: only as a word of its own
        whole = "".join(_char_forms(c) for c in secret)
        return re.compile(rf"(?<![A-Za-z0-9]){whole}(?![A-Za-z0-9])"), ()
    head = "".join(_char_forms(c) for c in secret[:MIN_KEY_PREFIX_CHARS])
    rest = tuple(re.compile(_char_forms(c)) for c in secret[MIN_KEY_PREFIX_CHARS:])
    return re.compile(head), rest


def redact_key(text: str, secret: str) -> str:
    """``text`` with every echo of ``secret`` (in any form the module docstring names,
    whole or a prefix of :data:`MIN_KEY_PREFIX_CHARS` or more characters) replaced by
    ``<redacted>``."""
    if not secret:
        return text
    head, rest = _key_patterns(secret)
    pieces: list[str] = []
    pos = 0
    while (match := head.search(text, pos)) is not None:
        end = match.end()
        for char in rest:
            more = char.match(text, end)
            if more is None:
                break
            end = more.end()
        pieces += (text[pos : match.start()], REDACTED)
        pos = end
    if not pieces:
        return text
    pieces.append(text[pos:])
    return "".join(pieces)


def _redact_str(text: str, secrets: tuple[bytes, ...]) -> str:
    for secret in secrets:
        if secret:
            text = redact_key(text, secret.decode("utf-8", "replace"))
    text = _BEARER.sub("Bearer <redacted>", text)
    text = _URL.sub("<upstream-url>", text)
    return _ADDRESS.sub("<address>", text)


def redact(data: bytes, secrets: tuple[bytes, ...] = ()) -> bytes:
    """``data`` with each of ``secrets`` (the provider's key, in any form it can be
    written: :func:`redact_key`) replaced by ``<redacted>``, any ``Bearer TOKEN`` by
    ``Bearer <redacted>``, any http(s) URL by ``<upstream-url>`` and any IP address or
    ``host:port`` by ``<address>``. Each replacement is plain ASCII without quotes or
    backslashes, so a JSON document stays one; bytes that are not UTF-8 are kept."""
    return _redact_str(data.decode("utf-8", "surrogateescape"), secrets).encode("utf-8", "surrogateescape")


def redact_text(text: str, secrets: tuple[bytes, ...] = ()) -> str:
    """An upstream-authored message as a client may see it: :func:`redact`, then every
    word that looks like a key masked (:func:`latgate.config.masking.mask_secrets`,
    ``sk-proj-...`` -> ``sk-***``), and a Python traceback and all after it replaced by
    ``(traceback removed)``."""
    cut = text.find(_TRACEBACK)
    if cut >= 0:
        text = text[:cut].rstrip() + " (traceback removed)"
    return mask_secrets(_redact_str(text, secrets))


#: how deep :func:`redact_json` goes into an error object; anything deeper is dropped
MAX_JSON_DEPTH = 16


def redact_json(value: Any, secrets: tuple[bytes, ...] = (), *, depth: int = 0) -> Any:
    """A decoded JSON value (an upstream's error object) with :func:`redact_text`
    applied to every string in it, object keys included; numbers, booleans and null as
    they are; a list or object nested deeper than :data:`MAX_JSON_DEPTH` becomes null."""
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict | list) and depth >= MAX_JSON_DEPTH:
        return None
    if isinstance(value, dict):
        return {redact_text(str(k), secrets): redact_json(v, secrets, depth=depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_json(v, secrets, depth=depth + 1) for v in value]
    return value
