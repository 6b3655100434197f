"""Which prompt prefixes each endpoint is believed to hold in its engine's prefix cache.

A prompt is read in a fixed order (the body's ``system``, its ``tools``, then every
message), and one hash is chained along it: a sample at the end of every message
and every ``BLOCK_CHARS`` within a long one, each naming the whole prompt up to that
point (a chained block hash, as vLLM's automatic prefix caching and llm-d's prefix
scorer hash token blocks), keyed with its character offset. Sample points are defined
by the content (message ends, offsets within a message), so two prompts sharing their
first messages share their samples that far: a session's next turn matches its
previous prompt whole. :class:`PromptPrefix` holds the samples and the prompt tokens up
to each (the request's token estimate spread over its characters), never the text.

:class:`PrefixIndex` is one endpoint's set of samples, recorded when the endpoint
served a request (its first token, or its answer) and aged out least recently used
against the tokens the engine can hold (``prefix_cache_tokens``, or the capacity the
engine reports). An entry costs at least ``MIN_ENTRY_TOKENS`` (an engine caches whole
blocks), so an index holds at most ``capacity / MIN_ENTRY_TOKENS`` entries whatever
clients send. The longest prefix held is found by binary search over a prompt's
samples: recording touches them from the end backwards, so an earlier one is never
older than a later one and what an index holds of a prompt is a prefix (the
approximate radix tree of SGLang's ``cache_aware`` router, in a flat set).

Routing estimates every request's prompt tokens (:mod:`latgate.routing.tokens`), and
on a pool whose engines cache prefixes samples the prompt too. Both read every
message's role, content and tool calls, so :func:`estimate_and_sample` reads each once:
it returns :func:`~latgate.routing.tokens.estimate_prompt_tokens`'s number and leaves
the samples for the next :func:`prompt_prefix` of the same body (found by the identity
of its ``messages``, ``system`` and ``tools``, as
:func:`~latgate.routing.tokens.encoded_json` finds the tools' JSON).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import orjson

from latgate.routing.tokens import (
    MAX_COUNTED_MESSAGES,
    MEMO_MIN_CHARS,
    MESSAGE_OVERHEAD_TOKENS,
    REPLY_PRIMER_TOKENS,
    _count_text,
    _memo,
    _message_tokens,
    _prompt_tokens,
    _text_tokens,
    encoded_json,
    estimate_prompt_tokens,
)

MIN_ENTRY_TOKENS = 16
"""What an entry costs at least against the capacity (vLLM's default block size)."""
MAX_SHORTFALL_DIVISOR = 8
"""The engine's reports may shrink an index's effective capacity to an eighth of its capacity, no less."""
DEFAULT_PREFIX_CACHE_TOKENS = 262_144
"""An endpoint's capacity before the config or the engine says (a 7-8B model on one
24-80 GB GPU holds some 10^5-10^6 tokens of KV cache)."""


BLOCK_CHARS = 4096
"""Characters between samples within a long message (about 1 000 tokens of English or code)."""
WINDOW_CHARS = 64
"""Characters hashed before each block boundary and at each end of a message's content."""
MAX_PROMPT_SAMPLES = 4096
"""Samples kept of one prompt (its first 4 096 messages and blocks); the rest is never matched."""


class Samples(NamedTuple):
    """A prompt's samples, before its tokens are spread over them.

    Attributes:
        keys: chained hashes, one per sample, in order.
        offsets: each sample's character offset (the characters read up to it).
        ends: the index in ``keys`` of each piece's (system, tools, message) last sample.
        chars: characters read (the last sample's offset).
        pieces: the prompt's pieces (system, tools, messages).
    """

    keys: list[int]
    offsets: list[int]
    ends: list[int]
    chars: int
    pieces: int


_last: tuple[object, object, object, Samples | None] | None = None


def _walk(pieces: list[Any], *, estimate: bool) -> tuple[float, Samples | None]:  # long: one loop over the messages, per request; a helper per message is a call per message
    """The messages' estimate (``REPLY_PRIMER_TOKENS`` and every message, in the order
    :mod:`latgate.routing.tokens` sums them; 0.0 unless ``estimate``) and the samples of
    ``pieces`` (None: nested past orjson's depth).

    Every message costs an estimate that :mod:`latgate.routing.tokens` makes anyway
    and one hash of a tuple of strings the body holds, whose own hashes the estimate's
    memo computed and Python keeps on them: no text is encoded or copied for it."""
    window, block, memo = WINDOW_CHARS, BLOCK_CHARS, _memo.tokens
    keys: list[int] = []
    sample = keys.append
    offsets: list[int] = []
    offset = offsets.append
    ends: list[int] = []
    mark = ends.append
    total = 0.0 + REPLY_PRIMER_TOKENS if estimate else 0.0
    running = done = 0
    read = pieces if len(pieces) <= MAX_PROMPT_SAMPLES else pieces[:MAX_PROMPT_SAMPLES]  # the rest is never matched
    broken = False
    for piece in read:
        if type(piece) is dict:
            role, content, calls = piece.get("role"), piece.get("content"), piece.get("tool_calls")
            if calls is None and type(content) is str and "name" not in piece:  # text alone: most messages
                if estimate:  # _text_tokens, inline (the caller sends the system prompt and tools to tokens when dicts)
                    total += MESSAGE_OVERHEAD_TOKENS + (
                        memo(content) if len(content) >= MEMO_MIN_CHARS else _count_text(content) if content else 0.0
                    )
            elif (
                (content is None or type(content) is str)
                and type(calls) is list
                and "name" not in piece
                and (shown := _plain_calls(calls))
            ):  # an agent's turn: tool calls, with or without text
                if estimate:  # _message_tokens, inline, in its order
                    own = MESSAGE_OVERHEAD_TOKENS + (_text_tokens(content) if content else 0.0)
                    for _, _, name, arguments in shown:
                        own += MESSAGE_OVERHEAD_TOKENS + (_text_tokens(name) if name else 0.0)
                        own += _text_tokens(arguments) if arguments else 0.0
                    total += own
                content, calls = b"" if content is None else content, shown
            else:
                if estimate:
                    total += _message_tokens(piece, _text_tokens)
                try:
                    if calls is not None:
                        calls = orjson.dumps(calls)
                    if type(content) is not str:
                        content = b"" if content is None else encoded_json(content)
                except orjson.JSONEncodeError:  # nested past orjson's depth: the wire encoding refuses the body (400)
                    broken = True
                    break
            if type(role) is not str and role is not None:  # the engine refuses such a message; here it only must not raise
                role = repr(type(role))
        else:  # the system prompt, the tools, or a malformed message (counted as nothing)
            role, content, calls = None, piece, None
            if type(content) is not str:
                try:
                    content = encoded_json(content)
                except orjson.JSONEncodeError:
                    broken = True
                    break
        size = len(content)
        if size > block:  # samples within a long content: the window before each boundary
            for at in range(block, size, block):
                running = hash((running, at, content[at - window : at]))
                sample(running)
                offset(done + at)
        running = hash((running, role, content, calls))  # a long content's hash: the token estimate's, kept on it
        done += size or 1
        mark(len(keys))
        sample(running)
        offset(done)
    if estimate and (broken or read is not pieces):  # the estimate reads every message
        for piece in pieces[len(ends) + 1 if broken else len(read) :]:
            if type(piece) is dict:
                total += _message_tokens(piece, _text_tokens)
    if broken or not keys:
        return total, None
    del keys[MAX_PROMPT_SAMPLES:], offsets[MAX_PROMPT_SAMPLES:]
    return total, Samples(keys, offsets, ends, done, len(pieces))


def _plain_calls(calls: list[Any]) -> tuple[tuple[str, str, str, str], ...] | None:
    """An assistant message's tool calls as ``(id, type, name, arguments)`` when each is
    a dict of exactly those string fields (``function`` holding the name and arguments),
    else None (hashed as their JSON): a tuple of strings the body holds, hashed without
    encoding them."""
    shown: list[tuple[str, str, str, str]] = []
    for call in calls:
        function = call.get("function") if type(call) is dict and len(call) == 3 else None
        if type(function) is not dict or len(function) != 2:
            return None
        ident, kind, name, arguments = call.get("id"), call.get("type"), function.get("name"), function.get("arguments")
        if type(ident) is not str or type(kind) is not str or type(name) is not str or type(arguments) is not str:
            return None
        shown.append((ident, kind, name, arguments))
    return tuple(shown) if shown else None


def _pieces(body: Mapping[str, Any]) -> list[Any] | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return None
        return [{"content": prompt}]
    system, tools = body.get("system"), body.get("tools")
    return [*(part for part in (system, tools) if part), *messages] if system or tools else messages


def estimate_and_sample(body: Mapping[str, Any]) -> int:
    """:func:`~latgate.routing.tokens.estimate_prompt_tokens` of ``body``, its samples
    left for the next :func:`sample_prompt` of the same body."""
    global _last
    messages = body.get("messages")
    system, tools = body.get("system"), body.get("tools")
    if (
        not isinstance(messages, list)
        or not messages
        or len(messages) > MAX_COUNTED_MESSAGES  # the estimate counts a sample of the messages
        or type(system) is dict
        or type(tools) is dict  # malformed: the walk would count it as a message
    ):
        return estimate_prompt_tokens(body)
    pieces = _pieces(body)
    assert pieces is not None
    messages_tokens, samples = _walk(pieces, estimate=True)
    _last = (messages, system, tools, samples)
    return round(_prompt_tokens(body, _text_tokens, messages_tokens=messages_tokens))


def sample_prompt(body: Mapping[str, Any]) -> Samples | None:
    """The samples of ``body``'s prompt (None: no messages or prompt, or unsampleable):
    the ones :func:`estimate_and_sample` left for this body, else read now."""
    last = _last
    messages = body.get("messages")
    if last is not None and last[0] is messages and last[1] is body.get("system") and last[2] is body.get("tools"):
        return last[3]
    pieces = _pieces(body)
    return None if pieces is None else _walk(pieces, estimate=False)[1]


@dataclass(slots=True)
class PromptPrefix:
    """One prompt's samples (see the module docstring).

    Attributes:
        keys: the samples' chained hashes (this process's), in order.
        offsets: each sample's character offset.
        tokens_per_char: the prompt's tokens over its characters (:meth:`tokens_at`
            spreads them over the samples' offsets).
        identity: the first message's sample (the prompt's identity when the client
            names no session), or None for a prompt of one message or none (it names
            no conversation: it is placed as any request is).
        session: the client's session key (:func:`latgate.routing.sessions.session_key`), or None.
        previous_tokens: prompt tokens up to the end of the message two before the last
            (where a session's previous turn ended: what the endpoint that served it
            holds at least).
    """

    keys: list[int]
    offsets: list[int]
    tokens_per_char: float
    identity: int | None = None
    session: int | None = None
    previous_tokens: int = 0

    def tokens_at(self, sample: int) -> int:
        """Prompt tokens up to the sample at index ``sample`` of ``keys``."""
        return int(self.offsets[sample] * self.tokens_per_char)

    @property
    def total_tokens(self) -> int:
        """The prompt's tokens (up to its last sample)."""
        return self.tokens_at(-1)


def prompt_prefix(body: Mapping[str, Any], *, prompt_tokens: int, session: int | None = None) -> PromptPrefix | None:
    """The samples of ``body``'s prompt, or None when it has no messages or prompt.

    A message is read as its role, its content (a string as it is, anything else as
    its JSON) and its tool calls (each call's id, type, function name and arguments
    when it has exactly those string fields, else their JSON), hashed with Python's own
    hash (per process, as the index is). Within a content longer than ``BLOCK_CHARS``, the
    ``WINDOW_CHARS`` before each block boundary are hashed into a sample of their own.
    The samples are the ones routing's token estimate took in the same walk over the
    messages (:func:`estimate_and_sample`), or read now
    when it took none of this body.

    Args:
        body: a chat completions body (``messages``, optional ``tools``), an Anthropic
            Messages body (``system`` too) or a completions body (``prompt``).
        prompt_tokens: the request's prompt tokens (routing's estimate).
        session: the client's session key, carried along.
    """
    samples = sample_prompt(body)
    if samples is None:
        return None
    keys, ends = samples.keys, samples.ends
    per_char = prompt_tokens / samples.chars
    identity = keys[ends[0]] if samples.pieces > 1 else None
    prefix = PromptPrefix(keys, samples.offsets, per_char, identity, session)
    if len(ends) >= 3 and ends[-3] < len(keys):
        prefix.previous_tokens = prefix.tokens_at(ends[-3])
    return prefix


class PrefixIndex:
    """The prompt prefixes one endpoint is believed to hold, bounded by ``capacity_tokens``.

    Example::

        index = PrefixIndex(capacity_tokens=100_000)
        index.record(prefix)
        index.longest_match_tokens(prefix)  # prefix.total_tokens
    """

    __slots__ = ("_entries", "_held_tokens", "capacity_tokens", "shortfall_tokens")

    def __init__(self, *, capacity_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS) -> None:
        self.capacity_tokens = capacity_tokens
        """What the engine can hold (the config's ``prefix_cache_tokens``, or what it reports)."""
        self.shortfall_tokens = 0
        """How much less than ``capacity_tokens`` the engine's reports showed it keeps of
        latgate's prompts (:meth:`correct`)."""
        self._entries: OrderedDict[int, int] = OrderedDict()
        self._held_tokens = 0

    @property
    def effective_capacity_tokens(self) -> int:
        """The tokens the index ages out against: ``capacity_tokens`` less the shortfall,
        at least ``1 / MAX_SHORTFALL_DIVISOR`` of it."""
        capacity = self.capacity_tokens
        return max(capacity // MAX_SHORTFALL_DIVISOR, capacity - self.shortfall_tokens)

    @property
    def entries(self) -> int:
        """Samples held."""
        return len(self._entries)

    @property
    def held_tokens(self) -> int:
        """Tokens the held samples stand for (at most ``capacity_tokens``)."""
        return self._held_tokens

    def longest_match_tokens(self, prefix: PromptPrefix) -> int:
        """Prompt tokens of the longest prefix of ``prefix`` held here (0: none)."""
        entries = self._entries
        keys = prefix.keys
        if not entries or keys[0] not in entries:
            return 0
        low, high = 0, len(keys) - 1  # keys[low] is held; find the last held
        while low < high:
            middle = (low + high + 1) // 2
            if keys[middle] in entries:
                low = middle
            else:
                high = middle - 1
        return prefix.tokens_at(low)

    def record(self, prefix: PromptPrefix) -> None:
        """The endpoint now holds ``prefix`` (it prefilled it): every sample becomes
        the most recently used, the first most of all; the least recently used go
        while over capacity."""
        entries = self._entries
        keys, tokens_at = prefix.keys, prefix.tokens_at
        held = self._held_tokens
        touch_all: partial[deque[None]] = partial(deque, maxlen=0)  # consumes map(move_to_end, ...) in C
        try:
            touch_all(map(entries.move_to_end, reversed(keys)))  # all held: a repeated prompt
        except KeyError:  # some are new (a session's next turn: its last samples): cost them, then touch
            for i in range(len(keys) - 1, -1, -1):
                if keys[i] not in entries:
                    cost = max(MIN_ENTRY_TOKENS, tokens_at(i) - (tokens_at(i - 1) if i else 0))
                    entries[keys[i]] = cost
                    held += cost
            touch_all(map(entries.move_to_end, reversed(keys)))  # the first the most recent
        capacity = self.effective_capacity_tokens
        while held > capacity and entries:
            held -= entries.popitem(last=False)[1]
        self._held_tokens = held

    def correct(self, shortfall_tokens: int) -> None:
        """The engine's report (:mod:`latgate.live.providers.cache_evidence`): it held
        ``shortfall_tokens`` less than the index believed (negative: more). The
        effective capacity moves by as much, within ``[capacity / MAX_SHORTFALL_DIVISOR,
        capacity]``, and the least recently used entries beyond it go at once."""
        capacity = self.capacity_tokens
        self.shortfall_tokens = min(capacity - capacity // MAX_SHORTFALL_DIVISOR, max(0, self.shortfall_tokens + shortfall_tokens))
        entries, held, effective = self._entries, self._held_tokens, self.effective_capacity_tokens
        while held > effective and entries:
            held -= entries.popitem(last=False)[1]
        self._held_tokens = held

    def clear(self) -> None:
        """Forget everything (the engine restarted, or lost its cache)."""
        self._entries.clear()
        self._held_tokens = 0
