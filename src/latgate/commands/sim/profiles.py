"""Simulator profiles for the demo: what each kind of provider feels like.

:func:`profile_for` maps a configured provider to the :class:`SimOptions` of a
simulator standing in for it, so ``latgate demo`` shows the differences routing
exploits:

========== ================================ ======= ========== ============== =========
profile    chosen when                      TPOT    TTFT extra prefill tok/s  batch
========== ================================ ======= ========== ============== =========
tilert     connector ``tile_rt_connector``  2.5 ms  20 ms      20 000         config or 8
           (TileRT's PD router: sim                                           decode
           profile ``tilert``)                                                nodes
decode     role ``decode`` or engine        1.5 ms  3 ms       50 000         config or 8
           ``tile-rt``
throughput role ``prefill``, engine or      22 ms   20 ms      20 000         config or 64
           connector ``vllm``/``sglang``, or
           a loopback/private address
upstream   role ``upstream``, or any other  15 ms   150 ms     50 000         256
========== ================================ ======= ========== ============== =========

Prefix caching follows the provider's: on for every engine but TileRT unless
``enable_prefix_cache = false`` (``ProviderConfig.caches_prefixes``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from latgate.commands.sim.options import SimOptions
from latgate.foundation.config.schema import ProviderConfig

Profile = Literal["tilert", "decode", "throughput", "upstream"]


@dataclass(frozen=True)
class ProfileTiming:
    """The timing knobs a profile sets (``max_batch_size`` unless the provider gives one)."""

    tpot_ms: float
    tpot_growth_ms: float
    ttft_overhead_ms: float
    prefill_tokens_per_second: float
    max_batch_size: int


PROFILE_TIMINGS: dict[Profile, ProfileTiming] = {
    "tilert": ProfileTiming(2.5, 0.0, 20.0, 20_000.0, 8),
    "decode": ProfileTiming(1.5, 0.05, 3.0, 50_000.0, 8),
    "throughput": ProfileTiming(22.0, 0.05, 20.0, 20_000.0, 64),
    "upstream": ProfileTiming(15.0, 0.0, 150.0, 50_000.0, 256),
}

DECODE_ENGINES = frozenset({"tile-rt", "tile_rt", "tilert"})
THROUGHPUT_ENGINES = frozenset({"vllm", "sglang"})


def profile_kind(provider: ProviderConfig) -> Profile:
    """Which profile a provider gets (see the module table)."""
    engine = (provider.engine or "").lower()
    if provider.connector == "tile_rt_connector":
        return "tilert"
    if provider.role == "decode" or engine in DECODE_ENGINES:
        return "decode"
    if provider.role == "upstream":
        return "upstream"
    if provider.role == "prefill" or engine in THROUGHPUT_ENGINES or provider.connector in THROUGHPUT_ENGINES:
        return "throughput"
    if any(_is_local(endpoint.api_base) for endpoint in provider.endpoints):
        return "throughput"
    return "upstream"


def profile_for(provider: ProviderConfig, *, seed: int | None = None) -> SimOptions:
    """The simulator options standing in for ``provider``.

    The simulator serves the provider's ``models`` (any name when it lists none) and
    is named after it.

    Example::

        options = profile_for(config.providers["tile-rt"])   # TileRT's router, 8 decode nodes
    """
    kind = profile_kind(provider)
    timing = PROFILE_TIMINGS[kind]
    slots = provider.max_batch_size or timing.max_batch_size
    # TileRT: one request per decode node, the node count standing in for the batch
    capacity = {"profile": "tilert", "decode_nodes": slots} if kind == "tilert" else {"max_batch_size": slots}
    return SimOptions(
        name=provider.name,
        models=provider.models,
        seed=seed,
        tpot_ms=timing.tpot_ms,
        tpot_growth_ms=timing.tpot_growth_ms,
        ttft_overhead_ms=timing.ttft_overhead_ms,
        prefill_tokens_per_second=timing.prefill_tokens_per_second,
        prefix_cache=provider.caches_prefixes and kind != "tilert",
        **capacity,
    )


def _is_local(api_base: str) -> bool:
    host = urlsplit(api_base).hostname or ""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private
