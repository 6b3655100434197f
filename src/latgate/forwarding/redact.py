"""Removing what must never reach a client from upstream text: internal URLs and
addresses, bearer tokens, the provider's own key (an upstream may echo what it was
sent), anything else that looks like a key, and stack traces; and bounding it.

The provider's key is found in every form an upstream may write it in, and in any
piece of it: any run of at least :data:`MIN_KEY_RUN_CHARS` consecutive characters of
the key (a prefix ``Incorrect API key provided: sk-proj-AbCd...``, its last 12
characters ``...1a2B3c4D5e6F``, a run from inside it), matched case-insensitively
(``SK-PROJ-ABCD``) after reading the text as a client would show it: JSON escapes
(``\\/`` as PHP's ``json_encode`` and several Java encoders write ``/``,
``\\u002f``, ``\\"``; escaped once more inside an embedded JSON string),
percent-encoding (``%2F``), HTML character references (``&#115;``, ``&#x6b;``,
``&sol;``) decoded, Unicode NFKC applied (fullwidth ``ｓｋ`` is ``sk``), and
whitespace and zero-width characters (U+200B-U+200D, U+2060, U+FEFF, a soft hyphen)
between the characters dropped (``s k - p r o j``). The whole run found is replaced,
with whatever escapes, spaces or entities it was written with. A key shorter than
:data:`MIN_KEY_RUN_CHARS` is redacted only where it stands whole as a word of its
own, so a one-character key does not blank out every word holding that letter.

Used on error paths and on stream bytes that are not chunks only, never per chunk;
the common case (ASCII text without ``\\``, ``%`` or ``&``) is read with string
methods, not character by character. Successful answers (chunks, whole bodies) get the
hot path's check instead, :class:`KeyEchoes`: a plain bytes search for the key as
JSON writes it.
"""

from __future__ import annotations

import bisect
import functools
import html.entities
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import orjson

from latgate.foundation.config.masking import mask_secrets

REDACTED = "<redacted>"
REDACTED_BYTES = REDACTED.encode()
#: the shortest run of the provider's key's characters that is redacted where an
#: upstream echoes it: long enough that it does not occur by chance in a message (a
#: random 8-character run of a 62-letter alphabet is one in 2e14), short enough to
#: cover a vendor prefix shown alone (``sk-proj-``) and a key's last 12 characters
MIN_KEY_RUN_CHARS = 8
#: the longest upstream-authored text (a message) shown to a client, in characters
MAX_UPSTREAM_TEXT_CHARS = 2048
#: the longest upstream-provided label (an error ``code`` or ``type``) kept for the
#: access log and ``/ui``, in characters
MAX_UPSTREAM_LABEL_CHARS = 64

_URL = re.compile(r"https?://[^\s\"'<>]+")
_BEARER = re.compile(r"(?i)bearer\s+[^\s\"',;]+")
#: an IPv4 address (with or without a port), or a host name or bracketed IPv6 address with a port
_ADDRESS = re.compile(
    r"(?<![\w.])(?:\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?"
    r"|(?:\[[0-9A-Fa-f:.]+\]|localhost|(?:[A-Za-z0-9-]+\.)+[A-Za-z][A-Za-z0-9-]*):\d{1,5})(?![\w.])"
)
#: where a Python traceback starts: it and all that follows are dropped from a message
_TRACEBACK = "Traceback (most recent call last)"
#: characters that take no room between a key's characters
_INVISIBLE = "\u00ad\u180e\u200b\u200c\u200d\u2060\ufeff"
#: one unit of text as a client would read it: an escape or reference (one character),
#: a run of whitespace or invisible characters (none), a run of plain ASCII (itself),
#: or any other single character (NFKC'd)
_UNIT = re.compile(
    r"(?P<json>\\+u[0-9A-Fa-f]{4}|\\+[/\"\\nrtbf])"
    r"|(?P<pct>%[0-7][0-9A-Fa-f])"
    r"|(?P<ref>&#[0-9]{1,7};|&#[xX][0-9A-Fa-f]{1,6};|&[A-Za-z][A-Za-z0-9]{1,31};)"
    rf"|(?P<gap>[\s{_INVISIBLE}]+)"
    r"|(?P<run>[!-$'-\[\]-~]+)"
    r"|(?P<other>.)",
    re.DOTALL,
)
#: the escapes and references of :data:`_UNIT`, alone (a quick first reading)
_ESCAPE = re.compile(_UNIT.pattern.split("|(?P<gap>")[0])
_NO_INVISIBLE = dict.fromkeys(map(ord, _INVISIBLE))
_JSON_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f"}
#: control characters (C0 but tab and newline, DEL, C1) and bidirectional overrides
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_LABEL_OTHER = re.compile(r"[^A-Za-z0-9_.:/-]+")


def _decoded_unit(match: re.Match[str]) -> str:
    """The character an escape or reference stands for ("" for whitespace)."""
    kind, text = match.lastgroup, match.group()
    if kind == "json":
        tail = text.lstrip("\\") or "\\"  # an escaped backslash alone (``\\\\``) stands for one
        char = chr(int(tail[1:], 16)) if tail[0] == "u" and len(tail) == 5 else _JSON_ESCAPES.get(tail, tail)
    elif kind == "pct":
        char = chr(int(text[1:], 16))
    elif text.startswith("&#"):
        code = int(text[3:-1], 16) if text[2] in "xX" else int(text[2:-1])
        char = chr(code) if code < 0x110000 else ""
    else:
        char = html.entities.html5.get(text[1:], text)
    return _folded_char(char) if len(char) == 1 else char.lower()


def _folded_char(char: str) -> str:
    if char.isspace() or char in _INVISIBLE:
        return ""
    return unicodedata.normalize("NFKC", char).lower()


def _quick_fold(text: str) -> str:
    """``text`` folded as :func:`_fold` does, without the map back (NFKC over the whole
    text at once): whether a key can be in it at all, at the speed of string methods."""
    if not (text.isascii() and "\\" not in text and "%" not in text and "&" not in text):
        text = unicodedata.normalize("NFKC", _ESCAPE.sub(_decoded_unit, text)).translate(_NO_INVISIBLE)
    return "".join(text.lower().split())


def _fold(text: str) -> tuple[str, list[int], list[int], list[int]]:
    """``text`` as it is compared with a key: escapes and references decoded, NFKC,
    lower case, whitespace and invisible characters dropped. Returns ``(folded,
    starts, origins, ends)``: folded piece ``i`` begins at ``starts[i]`` in ``folded``
    and came from ``text[origins[i]:ends[i]]``; a plain run maps character for
    character (``ends[i] == -1``)."""
    starts, origins, ends, folded = [], [], [], []
    at = 0
    for match in _UNIT.finditer(text):
        kind = match.lastgroup
        if kind == "gap":
            continue
        if kind == "run":
            piece, end = match.group().lower(), -1
        elif kind == "other":
            piece, end = _folded_char(match.group()), match.end()
        else:
            piece, end = _decoded_unit(match), match.end()
        if not piece:
            continue
        starts.append(at)
        origins.append(match.start())
        ends.append(end)
        folded.append(piece)
        at += len(piece)
    return "".join(folded), starts, origins, ends


def _original_span(index: tuple[list[int], list[int], list[int]], first: int, last: int) -> tuple[int, int]:
    """The span of the original text that folded characters ``first..last`` came from."""
    starts, origins, ends = index
    i = bisect.bisect_right(starts, first) - 1
    j = bisect.bisect_right(starts, last) - 1
    begin = origins[i] + (first - starts[i] if ends[i] < 0 else 0)
    end = origins[j] + (last - starts[j] + 1) if ends[j] < 0 else ends[j]
    return begin, end


@functools.lru_cache(maxsize=16)  # one or two keys per provider
def _folded_key(secret: str) -> str:
    return _fold(secret)[0]


def _key_runs(folded: str, key: str) -> list[tuple[int, int]]:
    """The maximal runs (first, last folded index) of ``folded`` that are runs of
    ``key`` of at least :data:`MIN_KEY_RUN_CHARS` characters, merged."""
    found: list[tuple[int, int]] = []
    width = MIN_KEY_RUN_CHARS
    for k in range(len(key) - width + 1):
        gram = key[k : k + width]
        at = folded.find(gram)
        while at >= 0:
            back = 0
            while back < k and at - back > 0 and folded[at - back - 1] == key[k - back - 1]:
                back += 1
            end = at + width
            while end < len(folded) and k + end - at < len(key) and folded[end] == key[k + end - at]:
                end += 1
            found.append((at - back, end - 1))
            at = folded.find(gram, end)
    found.sort()
    merged: list[tuple[int, int]] = []
    for first, last in found:
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def redact_key(text: str, secret: str) -> str:
    """``text`` with every echo of ``secret`` (any run of :data:`MIN_KEY_RUN_CHARS` or
    more of its characters, in any form the module docstring names) replaced by
    ``<redacted>``; a shorter key only where it stands whole as a word."""
    key = _folded_key(secret) if secret else ""
    if not key:
        return text
    quick = _quick_fold(text)
    if len(key) < MIN_KEY_RUN_CHARS:
        if key not in quick:
            return text
    elif not any(key[k : k + MIN_KEY_RUN_CHARS] in quick for k in range(len(key) - MIN_KEY_RUN_CHARS + 1)):
        return text  # the common case: no piece of the key anywhere
    folded, *index = _fold(text)
    if len(key) < MIN_KEY_RUN_CHARS:
        runs = []
        at = folded.find(key)
        while at >= 0:
            runs.append((at, at + len(key) - 1))
            at = folded.find(key, at + len(key))
    else:
        runs = _key_runs(folded, key)
    pieces: list[str] = []
    pos = 0
    for first, last in runs:
        begin, end = _original_span((index[0], index[1], index[2]), first, last)
        if len(key) < MIN_KEY_RUN_CHARS and (_word_char(text, begin - 1) or _word_char(text, end)):
            continue
        pieces += (text[pos:begin], REDACTED)
        pos = end
    if not pieces:
        return text
    pieces.append(text[pos:])
    return "".join(pieces)


def _word_char(text: str, at: int) -> bool:
    return 0 <= at < len(text) and text[at].isascii() and text[at].isalnum()


def bounded_text(text: str, limit: int = MAX_UPSTREAM_TEXT_CHARS) -> str:
    """Upstream text made safe to show or log: control characters (but tab and
    newline) and bidirectional overrides removed, cut to ``limit`` characters
    (``...`` marks a cut)."""
    text = _CONTROL.sub("", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def upstream_label(value: object, secrets: tuple[bytes, ...] = ()) -> str | None:
    """An upstream's error ``code`` or ``type`` as the access log and ``/ui`` show it:
    ``None`` unless a non-empty string; redacted (:func:`redact_text`), every run of
    characters other than letters, digits and ``_.:/-`` made one ``_``, cut to
    :data:`MAX_UPSTREAM_LABEL_CHARS`."""
    if not isinstance(value, str) or not value:
        return None
    label = _LABEL_OTHER.sub("_", redact_text(value[: MAX_UPSTREAM_TEXT_CHARS], secrets))
    return label[:MAX_UPSTREAM_LABEL_CHARS] or None


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
    word that looks like a key masked (:func:`latgate.foundation.config.masking.mask_secrets`,
    ``sk-proj-...`` -> ``sk-***``), a Python traceback and all after it replaced by
    ``(traceback removed)``, and bounded (:func:`bounded_text`)."""
    text = text[: MAX_UPSTREAM_TEXT_CHARS + 1]  # no more is shown: no more is read (a key cut here is a run still)
    cut = text.find(_TRACEBACK)
    if cut >= 0:
        text = text[:cut].rstrip() + " (traceback removed)"
    return bounded_text(mask_secrets(_redact_str(text, secrets)))


#: the longest piece of a key the hot path's first search looks for, in bytes: the
#: search's set-up is linear in it, its skips grow with it; 16 is about the best for a
#: chunk of a few hundred bytes, and still never found by chance
_PROBE_BYTES = 16
#: characters JSON may write escaped (RFC 8259, section 7, and ``\\/``)
_ESCAPABLE = re.compile(rb'["\\/]')


@dataclass(frozen=True, slots=True)
class KeyEchoes:
    """The provider's key as a successful answer (a chunk, a run of whole SSE events, a
    whole body) could echo it, for the hot path's check (:meth:`scrubbed`).

    Attributes:
        forms: each key of at least :data:`MIN_KEY_RUN_CHARS` characters as it is,
            JSON-escaped (``"`` and ``\\`` as ``\\"``, ``\\\\``; RFC 8259, section 7)
            and with ``/`` also written ``\\/`` (PHP's ``json_encode``, several Java
            encoders); duplicates dropped (a key of letters, digits and ``-_`` is one).
        probe: bytes every form holds (of one key: the last :data:`_PROBE_BYTES` of its
            longest run without a character JSON may escape; of several keys: ``b""``),
            searched first.
    """

    forms: tuple[bytes, ...]
    probe: bytes

    def scrubbed(self, data: bytes) -> bytes:
        """``data`` with every occurrence of each form replaced by ``<redacted>`` (which
        keeps a JSON string one); ``data`` itself when the probe is not in it. A plain
        bytes search, cheap enough for every chunk. A key written otherwise
        (``\\u``-escaped letters, split between two chunks' texts) is not found."""
        if self.probe not in data:
            return data
        for form in self.forms:
            if form in data:
                data = data.replace(form, REDACTED_BYTES)
        return data


@functools.lru_cache(maxsize=64)  # one per provider key: the same tuple each request, hashed once
def bare_key(authorization: str) -> tuple[bytes, ...]:
    """The key of an ``Authorization`` header's value (``Bearer KEY``) as the redaction
    functions take it (``secrets``): ``(KEY,)``, or ``()`` for no header."""
    return (authorization.removeprefix("Bearer ").encode(),) if authorization else ()


@functools.lru_cache(maxsize=64)  # one tuple per provider key
def key_echoes(secrets: tuple[bytes, ...]) -> KeyEchoes | None:
    """The :class:`KeyEchoes` of ``secrets`` (the provider's key); ``None`` when none is
    :data:`MIN_KEY_RUN_CHARS` characters or longer. A shorter key is left out: as bare
    bytes it would match inside ordinary words and JSON (a whole-word match is the error
    paths' :func:`redact_key`)."""
    keys = [secret for secret in secrets if len(secret.decode("utf-8", "replace")) >= MIN_KEY_RUN_CHARS]
    forms: list[bytes] = []
    for secret in keys:
        escaped = orjson.dumps(secret.decode("utf-8", "replace"))[1:-1]
        for form in (secret, escaped, escaped.replace(b"/", b"\\/")):
            if form not in forms:
                forms.append(form)
    if not keys:
        return None
    probe = b""
    if len(keys) == 1:
        probe = max(_ESCAPABLE.split(keys[0]), key=len)[-_PROBE_BYTES:]
    return KeyEchoes(forms=tuple(forms), probe=probe)


def scrub_key_echoes(data: bytes, secrets: tuple[bytes, ...]) -> bytes:
    """``data`` (a whole answer) with the echoes of ``secrets`` redacted
    (:meth:`KeyEchoes.scrubbed`)."""
    echoes = key_echoes(secrets)
    return data if echoes is None else echoes.scrubbed(data)


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
