"""The simulated prefix cache: which leading parts of a prompt were computed before.

A prompt is a sequence of segments (its chat messages, after the tool definitions).
:func:`prefix_digests` gives one digest per leading run of segments, each one
depending on everything before it, so a hit on digest ``k`` means the first ``k + 1``
segments are identical to an earlier prompt's: what an engine's prefix cache (vLLM's
automatic prefix caching, SGLang's radix cache) would reuse.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import orjson


def prefix_digests(segments: Sequence[object], *, context: object = None) -> list[bytes]:
    """Cumulative digests of ``segments`` (JSON values), the ``context`` (e.g. tools) mixed into all."""
    running = hashlib.blake2b(digest_size=16)
    running.update(orjson.dumps(context, option=orjson.OPT_SORT_KEYS))
    digests = []
    for segment in segments:
        running.update(orjson.dumps(segment, option=orjson.OPT_SORT_KEYS))
        digests.append(running.copy().digest())
    return digests


class PrefixCache:
    """A bounded LRU set of prefix digests (``capacity`` entries)."""

    def __init__(self, *, capacity: int = 8192) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def cached_segments(self, digests: Sequence[bytes]) -> int:
        """How many leading segments are cached (0: none)."""
        for index in range(len(digests) - 1, -1, -1):
            if digests[index] in self._entries:
                self._entries.move_to_end(digests[index])
                return index + 1
        return 0

    def insert(self, digests: Sequence[bytes]) -> None:
        """Remember every prefix of a prompt that was just computed."""
        for digest in digests:
            self._entries[digest] = None
            self._entries.move_to_end(digest)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
