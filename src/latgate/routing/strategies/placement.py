"""Which conversation the predicted-latency strategy placed where, and how many each
endpoint holds: the session balance a new session's first turn is placed by.

A conversation is a client's session (:func:`latgate.routing.sessions.session_key`) or,
for a client that names none, its prompt's first message and first user message
(:func:`conversation_key`): every turn of one agent session resends both, and two
sessions of one agent differ in the second. :class:`Placements` keeps, per conversation,
the endpoint its latest turn was routed to; a conversation idle for ``IDLE_SECONDS``
no longer counts (the time hosted prompt caches keep an idle prefix: Anthropic's
prompt caching, 5 minutes by default; OpenAI's, 5-10 minutes), and at most
``MAX_CONVERSATIONS`` are kept, the least recently routed going first. Nothing of a
prompt is kept but a 64-bit number.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from latgate.routing.prefix_index import WINDOW_CHARS, PromptPrefix

IDLE_SECONDS = 300.0
MAX_CONVERSATIONS = 65_536


def conversation_key(body: Mapping[str, Any], prefix: PromptPrefix) -> int | None:
    """The conversation ``body``'s prompt belongs to: the client's session when it names
    one, else the prompt's first message (``prefix.identity``) with its first user
    message (its length and its first and last ``WINDOW_CHARS`` characters, as the
    prefix index reads a long content; the first message alone when it is the user's);
    None for a prompt of one message, or with no user message.

    Example::

        conversation_key(turn_1_body, prompt_prefix(turn_1_body, prompt_tokens=9_000))
        # the same number for every later turn of that session, in this process
    """
    if prefix.session is not None:
        return prefix.session
    if prefix.identity is None:
        return None
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    leading = not (body.get("system") or body.get("tools"))
    for index, message in enumerate(messages):
        if type(message) is dict and message.get("role") == "user":
            if index == 0 and leading:  # the first message is the user's own
                return prefix.identity
            content = message.get("content")
            if type(content) is list and content and type(content[0]) is dict:
                content = content[0].get("text")
            if type(content) is not str:
                content = repr(type(content))
            shown = (
                content
                if len(content) <= 2 * WINDOW_CHARS
                else (len(content), content[:WINDOW_CHARS], content[-WINDOW_CHARS:])
            )
            return hash((prefix.identity, shown))
    return None


class Placements:
    """Conversation -> the endpoint id its latest turn was routed to, with each
    endpoint's count of conversations (see the module docstring).

    Example::

        placements = Placements()
        placements.place(7, "pool-0", now=0.0)
        placements.counts(now=1.0)   # {"pool-0": 1}
        placements.counts(now=400.0)  # {"pool-0": 0}: idle past IDLE_SECONDS
    """

    __slots__ = ("_counts", "_where", "idle_seconds", "max_conversations")

    def __init__(
        self, *, idle_seconds: float = IDLE_SECONDS, max_conversations: int = MAX_CONVERSATIONS
    ) -> None:
        self.idle_seconds = idle_seconds
        self.max_conversations = max_conversations
        self._where: OrderedDict[int, tuple[str, float]] = OrderedDict()
        self._counts: dict[str, int] = {}

    def __len__(self) -> int:
        """Conversations kept (idle ones included until the next call that expires them)."""
        return len(self._where)

    def where(self, conversation: int) -> str | None:
        """The endpoint id the conversation's latest turn was routed to, or None."""
        placed = self._where.get(conversation)
        return None if placed is None else placed[0]

    def place(self, conversation: int, endpoint_id: str, *, now: float) -> None:
        """The conversation's turn was routed to ``endpoint_id`` at ``now`` (seconds)."""
        self._expire(now)
        where, counts = self._where, self._counts
        old = where.pop(conversation, None)
        if old is not None:
            counts[old[0]] -= 1
        where[conversation] = (endpoint_id, now)
        counts[endpoint_id] = counts.get(endpoint_id, 0) + 1
        while len(where) > self.max_conversations:
            counts[where.popitem(last=False)[1][0]] -= 1

    def counts(self, *, now: float) -> Mapping[str, int]:
        """Conversations by endpoint id, those idle past ``idle_seconds`` left out
        (an endpoint holding none may be missing)."""
        self._expire(now)
        return self._counts

    def _expire(self, now: float) -> None:
        where, counts = self._where, self._counts
        oldest = now - self.idle_seconds
        while where:
            endpoint_id, at = next(iter(where.values()))
            if at >= oldest:
                return
            where.popitem(last=False)
            counts[endpoint_id] -= 1
