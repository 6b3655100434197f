"""What ``/admin/providers`` and ``/ui`` show of the providers: every endpoint's live
numbers and circuit, its prefix index and its cache hits predicted against reported.

Ids only, never URLs or keys. Times in ms unless named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from latgate.live.providers.health import CLOSED, OPEN

if TYPE_CHECKING:
    from latgate.live.providers.endpoint import EndpointRuntime
    from latgate.live.providers.runtime import ProviderRuntime


def describe_providers(providers: Mapping[str, ProviderRuntime], now: float) -> dict[str, dict[str, object]]:
    """Every provider by name at ``now`` (clock seconds): its connector, role, engine,
    models, whether its key is configured, and its endpoints (:func:`describe_endpoint`)."""
    out: dict[str, dict[str, object]] = {}
    for name, runtime in providers.items():
        cfg = runtime.config
        out[name] = {
            "connector": cfg.connector,
            "role": cfg.role,
            "engine": cfg.engine,
            "models": list(cfg.models),
            "key_configured": bool(runtime.auth_headers),
            "endpoints": [describe_endpoint(ep, now) for ep in runtime.endpoints],
        }
    return out


# long: one dict literal, the /admin/providers shape of an endpoint, read top to bottom as its clients see it
def describe_endpoint(endpoint: EndpointRuntime, now: float) -> dict[str, object]:
    """One endpoint's live numbers and circuit at ``now`` (clock seconds).

    ``prefix_index`` (None without a prefix cache): ``entries`` (samples held),
    ``held_tokens``, ``capacity_tokens`` (the engine's or the config's) and
    ``effective_capacity_tokens`` (less what the engine's reports showed it evicted
    sooner). ``cache_hits``: prompt tokens latgate predicted served from the engine's
    cache against those the engine reported (:class:`~latgate.live.providers.cache_hits.CacheHits`).
    """
    record = endpoint.breaker.store.get(endpoint.key)
    circuit = endpoint.breaker.circuit(endpoint.key)
    predictor = endpoint.predictor
    index = endpoint.prefix_index
    return {
        "id": endpoint.config.id,
        "healthy": circuit == CLOSED,
        "circuit": circuit,
        "circuit_reason": record.reason,
        "reopens_in_seconds": round(max(0.0, record.opened_at + record.open_seconds - now), 3)
        if circuit == OPEN
        else None,
        "ejection_evidence": endpoint.ejection_evidence if record.reason == "latency" else None,
        "consecutive_failures": record.consecutive_failures,
        "in_flight": endpoint.in_flight,
        "requests": endpoint.requests,
        "failures": endpoint.failures,
        "error_rate": round(endpoint.error_rate, 4),
        "capacity": endpoint.capacity or endpoint.inferred_capacity,
        "queue_ms": round(endpoint.queue_ms(now), 1),
        "predicted_ttft_ms_at_1k_tokens": round(endpoint.predicted_ttft_ms(1000, now), 1),
        "ttft_model": {
            "base_ms": round(predictor.base_ms, 2),
            "per_1k_tokens_ms": round(predictor.per_token_ms * 1000, 2),
            "spread_ms": round(predictor.spread_ms, 2),
            "observations": predictor.observations,
            "age_seconds": None if endpoint.observed_at is None else round(now - endpoint.observed_at, 3),
        },
        "measured_ttft_ms": None if endpoint.measured_ttft_ms is None else round(endpoint.measured_ttft_ms, 1),
        "weight": endpoint.config.weight,
        "busy": endpoint.busy(now),
        "slot_seconds": round(endpoint.slot_seconds, 4),
        "itl_ms": None if endpoint.itl_ms is None else round(endpoint.itl_ms, 3),
        "itl_observations": endpoint.itl.observations,
        "prefix_index": None
        if index is None
        else {
            "entries": index.entries,
            "held_tokens": index.held_tokens,
            "capacity_tokens": index.capacity_tokens,
            "effective_capacity_tokens": index.effective_capacity_tokens,
        },
        "cache_hits": None if index is None else endpoint.cache_hits.describe(),
        "prefill_tokens": endpoint.prefill_tokens,
        "engine": None
        if endpoint.engine_read_at is None
        else {
            "running": endpoint.engine_running,
            "waiting": endpoint.engine_waiting,
            "age_seconds": round(now - endpoint.engine_read_at, 3),
        },
        "probe": None
        if endpoint.probe_at is None
        else {
            "ok": endpoint.probe_ok,
            "ms": round(endpoint.probe_ms or 0.0, 1),
            "age_seconds": round(now - endpoint.probe_at, 3),
        },
    }
