"""The seam for other wire dialects (Anthropic Messages, OpenAI Responses).

latgate speaks chat completions to every provider. An API that is translated (its
handler builds a chat-completions body from the client's request) hands the forwarder a
:class:`ResponseTransform`, which turns the upstream's chat-completions answer back into
the client's dialect. Without one (the OpenAI routes) bytes pass through untouched.

Protocol details live with each implementation (``latgate.request.translate``).
"""

from __future__ import annotations

from typing import Protocol


class UntranslatableAnswer(Exception):
    """A whole upstream answer that is not a chat completion a transform can translate
    (``str()``: what it is, e.g. "a chat completion without a choice"): the provider's
    failure, a 502 in the client's envelope (:mod:`latgate.forwarding.attempt`)."""


class ResponseTransform(Protocol):
    """Converts one upstream chat-completions response into the client's wire format.

    ``feed`` receives complete SSE events (bytes exactly as forwarded, possibly several
    events), in order, and returns the bytes to send to the client instead (possibly
    ``b""``). ``finish`` is called once at the end of a stream: ``error`` is ``None`` for
    a clean end, else the message of a mid-stream upstream failure; it returns the
    closing bytes. ``complete`` converts a whole non-streamed JSON body, raising
    :class:`UntranslatableAnswer` when it is not one it can translate.
    """

    #: content type of the translated stream (e.g. ``text/event-stream``).
    stream_content_type: str
    #: what keeps the stream alive while it waits for its first token
    #: (:mod:`latgate.forwarding.keepalive`): an SSE comment, or the dialect's own event.
    keepalive_event: bytes

    def feed(self, events: bytes) -> bytes: ...

    def finish(self, *, error: str | None) -> bytes: ...

    def complete(self, body: bytes) -> bytes: ...
