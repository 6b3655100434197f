"""The fast path of the SSE tap (:mod:`latgate.forwarding.sse`): a chat chunk that differs
from the stream's last parsed content chunk only in the text of its one content string
is counted from its bytes, without a JSON parse."""

from __future__ import annotations

from typing import Any

#: delta fields whose non-empty string value makes a choice generated content
TEXT_FIELDS = ("content", "reasoning_content", "reasoning")


class ChunkTemplate:
    """The bytes around the text of a parsed single-choice content chunk: a later
    payload made of the same ``head``, a different non-empty JSON string body and the
    same ``tail`` parses to the same structure with other text, so it is one content
    unit, with no usage and no error, like the chunk the template came from.

    The body test is conservative: no ``"`` at all (an escaped quote sends the chunk
    to the parser), no CR (which JSON forbids there and a client's SSE parser reads
    as a line end) and no trailing backslash (which could escape the closing quote).
    Its escapes and UTF-8 are not checked: a chunk of this shape whose text is not
    valid JSON counts as content (forwarded as it is either way), where a parse would
    count nothing. Chunks that also change elsewhere (a per-chunk ``created``, a random
    padding field, a Responses event's ``sequence_number``) are parsed as before.

    The test itself is inline in :meth:`latgate.forwarding.sse_facts.ChunkFacts._chunk`
    (it runs once per chunk, where a method call costs more than the test).
    """

    __slots__ = ("head", "head_len", "tail", "tail_len")

    def __init__(self, head: bytes, tail: bytes) -> None:
        self.head, self.tail = head, tail
        self.head_len, self.tail_len = len(head), len(tail)

    @classmethod
    def of(cls, payload: bytes, delta: dict[str, Any]) -> ChunkTemplate | None:
        """The template of ``payload``, a parsed chunk whose one choice counts as content
        through exactly one non-empty string in ``delta`` (else ``None``). The field's
        key must occur once in the payload, so the bytes found are the delta's."""
        truthy = [key for key in (*TEXT_FIELDS, "tool_calls") if delta.get(key)]
        if len(truthy) != 1 or truthy[0] == "tool_calls" or not isinstance(delta[truthy[0]], str):
            return None
        key = b'"' + truthy[0].encode() + b'"'
        at = payload.find(key)
        if at < 0 or payload.find(key, at + 1) >= 0:
            return None
        start = at + len(key)
        for opener in (b':"', b': "'):
            if payload.startswith(opener, start):
                start += len(opener)
                break
        else:
            return None
        end = start
        while True:  # the closing quote: the first one not escaped by an odd run of backslashes
            end = payload.find(b'"', end)
            if end < 0:
                return None
            slashes = 0
            while payload[end - 1 - slashes] == 92:
                slashes += 1
            if slashes % 2 == 0:
                break
            end += 1
        return cls(payload[:start], payload[end:])
