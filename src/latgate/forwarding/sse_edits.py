"""What the SSE tap changes in the bytes it forwards; everything else passes as the
upstream wrote it.

- The usage-only chunk latgate asked for on the client's behalf is dropped, and
  ``usage`` taken out of a chunk with choices that carries it anyway (TileRT's finish
  chunk). Dropping it is invisible to the client: an engine that moves fields to that
  chunk when usage is asked for (vLLM puts ``system_fingerprint`` on each terminal
  chunk, the one with a ``finish_reason``, without usage, and only on the usage chunk
  with it: ``vllm/entrypoints/openai/chat_completion/serving.py``, and ``completion/``
  alike) has them put back: from the first terminal chunk without a
  ``system_fingerprint`` on, events are held until the usage chunk (or ``[DONE]``, or
  the end), and the usage chunk's ``system_fingerprint`` is appended to each such
  terminal chunk, where the engine would have written it.
- The upstream model name is rewritten back to the alias the client asked for.
- Bytes that are not chunk data reach the client redacted: a comment as a bare ``:``,
  any other line through :func:`~latgate.forwarding.redact.redact_text`, line endings the
  stream's own.
- The provider's key, should an upstream echo it in chunk data (an ``id``, ``model``,
  ``system_fingerprint``, a delta's text), becomes ``<redacted>``
  (:class:`~latgate.forwarding.redact.KeyEchoes`, a bytes search in each run of whole
  events forwarded). The framing forwards whole events only, so a key
  split between two reads of the upstream body is whole in the bytes searched, and
  nothing is held back for it.

:class:`StreamEdits` sits between the chunk facts (:mod:`latgate.forwarding.sse_facts`),
which flag what to drop, strip or stamp, and the framing (:mod:`latgate.forwarding.sse`),
which calls these edits on whole events.
"""

from __future__ import annotations

import re

import orjson

from latgate.forwarding.redact import key_echoes, redact_text
from latgate.forwarding.sse_facts import ChunkFacts

_LF_SEP = b"\n\n"
_CRLF_SEP = b"\r\n\r\n"
#: every line ending a client's SSE parser knows (HTML Living Standard 9.2.6)
_LINE_END = re.compile(rb"\r\n|\r|\n")


class StreamEdits(ChunkFacts):
    """The tap's edits (see :class:`~latgate.forwarding.sse.StreamTap` for the arguments)."""

    __slots__ = ("_echoes", "_held", "_rewrite", "_secrets", "_sep")

    def __init__(
        self,
        *,
        drop_usage_chunk: bool,
        model_rewrite: tuple[str, str] | None,
        text_error: bytes | None,
        secrets: tuple[bytes, ...],
    ) -> None:
        super().__init__(drop_usage_chunk=drop_usage_chunk, text_error=text_error)
        self._secrets = secrets
        self._echoes = key_echoes(secrets)  # the key as chunk data could carry it; None for none
        self._sep: bytes | None = None  # the stream's event separator, once framing saw one
        self._rewrite: tuple[tuple[bytes, bytes], ...] | None = None
        if model_rewrite is not None:
            served, public = (orjson.dumps(name) for name in model_rewrite)
            self._rewrite = ((b'"model":' + served, b'"model":' + public), (b'"model": ' + served, b'"model": ' + public))
        # Held events (event bytes, needs the fingerprint) while waiting for a dropped
        # usage chunk; None when not holding.
        self._held: list[tuple[bytes, bool]] | None = None

    def _rewritten(self, data: bytes) -> bytes:
        """``data`` (whole events) as forwarded: the model name rewritten, the key's echoes redacted."""
        if self._rewrite is not None and data:
            for old, new in self._rewrite:
                data = data.replace(old, new)
        return data if self._echoes is None else self._echoes.scrubbed(data)

    def release_held(self) -> bytes:
        """The events held back for a usage chunk that will not come (the upstream
        broke off), as they arrived; ``b""`` when none."""
        if self._held is None:
            return b""
        self._fingerprint = None
        return self._rewritten(self._release(self._sep or _LF_SEP))

    def _hold(self, event: bytes) -> None:
        """Keep ``event`` (without its separator) back until the usage chunk comes."""
        if self._held is None:
            self._held = []
        self._held.append((event, self._unstamped))
        self._unstamped = False

    def _release(self, sep: bytes) -> bytes:
        """The held events, each terminal chunk given the usage chunk's
        ``system_fingerprint`` (when it carried one), with their separators."""
        held, self._held = self._held or [], None
        stamp = None if self._fingerprint is None else b',"system_fingerprint":' + self._fingerprint + b"}"
        out = []
        for event, unstamped in held:
            if unstamped and stamp is not None and event.endswith(b"}"):
                event = event[:-1] + stamp
            out.append(event + sep)
        return b"".join(out)

    def _foreign(self, event: bytes, sep: bytes, *, keep_data: bool = False) -> bytes:
        """``event`` (without its separator) as it may reach a client: each comment line
        a bare ``:``, each other line redacted (``keep_data``: its ``data`` lines, read
        as a chunk, as they are), lines ended in the stream's own line ending."""
        newline = b"\r\n" if sep == _CRLF_SEP else b"\n"
        lines: list[bytes] = []
        for line in _LINE_END.split(event):
            if not line:
                continue
            if line[0] == 58:  # ":", a comment
                if not lines or lines[-1] != b":":
                    lines.append(b":")
            elif keep_data and line.startswith(b"data:"):
                lines.append(line)
            else:
                lines.append(redact_text(line.decode("utf-8", "replace"), self._secrets).encode())
        return newline.join(lines) if lines else b":"

    def _stripped(self) -> bytes:
        """The chunk just parsed, re-encoded without its ``usage``."""
        chunk, self._strip = self._strip or {}, None
        del chunk["usage"]
        return b"data: " + orjson.dumps(chunk)
