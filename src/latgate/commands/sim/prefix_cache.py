"""The simulated prefix cache: fixed-size token blocks, chained, evicted LRU.

Modelled on vLLM's automatic prefix caching (docs "Automatic Prefix Caching", the v1
``KVCacheManager``): a prompt is cut into blocks of ``block_tokens`` tokens; only full
blocks are cached; a block is identified by its own tokens *and* every token before it
(vLLM chains each block's hash to its parent's), so a hit on block ``k`` means blocks
``0..k`` all match; the cache holds ``capacity_tokens // block_tokens`` blocks and
evicts the least recently used one first. A lookup touches the matched blocks tail
first, so a prompt's leading blocks (a shared system prompt) are the last to go, as
vLLM frees a request's blocks in reverse order.

The simulator has no tokenizer: a prompt is a sequence of segments (the tool
definitions, then each chat message; or a completions prompt), each with a
cumulative digest (everything up to and including it) and an estimated token count
(:func:`latgate.routing.tokens.estimate_prompt_tokens`). A block's key is the digest of
the segment its last token falls in plus that token's offset in the segment: two
prompts share the key exactly when they share every segment up to that one, so
blocks match as far as whole messages match (a message edited part-way misses from
its start, where a real engine would still reuse the blocks before the edit).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import orjson

BlockKey = tuple[bytes, int]
"""(cumulative digest of the segment holding the block's last token, offset past it)."""


def prefix_digests(segments: Sequence[object], *, context: object = None) -> list[bytes]:
    """Cumulative digests of ``segments`` (JSON values), the ``context`` (e.g. tools) mixed into all.

    Digest ``k`` depends on ``context`` and ``segments[0..k]`` and on nothing else.
    """
    running = hashlib.blake2b(digest_size=16)
    running.update(orjson.dumps(context, option=orjson.OPT_SORT_KEYS))
    digests = []
    for segment in segments:
        running.update(orjson.dumps(segment, option=orjson.OPT_SORT_KEYS))
        digests.append(running.copy().digest())
    return digests


def block_keys(
    digests: Sequence[bytes], segment_tokens: Sequence[int], *, block_tokens: int, max_tokens: int
) -> list[BlockKey]:
    """Keys of the full blocks of a prompt, in order.

    Args:
        digests: the segments' cumulative digests (:func:`prefix_digests`).
        segment_tokens: each segment's length in tokens (>= 0), same length as ``digests``.
        block_tokens: tokens per block (>= 1).
        max_tokens: at most this many tokens are cut into blocks (vLLM never serves the
            prompt's last token from the cache: pass ``prompt_tokens - 1``).

    Returns:
        One key per full block within the first ``max_tokens`` tokens.
    """
    keys: list[BlockKey] = []
    start = 0  # first token of the current segment
    boundary = block_tokens  # one past the last token of the next block
    for digest, tokens in zip(digests, segment_tokens, strict=True):
        end = start + tokens
        while boundary <= end and boundary <= max_tokens:
            keys.append((digest, boundary - start))
            boundary += block_tokens
        if boundary > max_tokens:
            break
        start = end
    return keys


class BlockCache:
    """A bounded LRU set of prompt blocks.

    Args:
        capacity_tokens: tokens it holds (>= 0); ``capacity_tokens // block_tokens`` blocks.
        block_tokens: tokens per block (>= 1).

    Attributes:
        queried_tokens / hit_tokens: prompt tokens looked up and found, since start
            (vLLM's ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``).
    """

    def __init__(self, *, capacity_tokens: int, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[BlockKey, None] = OrderedDict()
        self.queried_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._blocks)

    @property
    def usage(self) -> float:
        """Share of the capacity in use, 0..1 (vLLM's ``vllm:kv_cache_usage_perc``)."""
        return len(self._blocks) / self.capacity_blocks if self.capacity_blocks else 0.0

    def lookup(self, keys: Sequence[BlockKey], *, prompt_tokens: int) -> int:
        """Cached tokens of a prompt: the leading blocks of ``keys`` held, times the block
        size. Touches them and counts ``prompt_tokens`` queried, the result hit."""
        matched = 0
        for key in keys:
            if key not in self._blocks:
                break
            matched += 1
        for index in range(matched - 1, -1, -1):
            self._blocks.move_to_end(keys[index])
        cached = matched * self.block_tokens
        self.queried_tokens += prompt_tokens
        self.hit_tokens += cached
        return cached

    def insert(self, keys: Sequence[BlockKey]) -> None:
        """Hold every block of a prompt just prefilled, evicting the least recently used."""
        if not self.capacity_blocks:
            return
        blocks = self._blocks
        for index in range(len(keys) - 1, -1, -1):
            key = keys[index]
            blocks[key] = None
            blocks.move_to_end(key)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
