"""Through real servers on loopback: a latency-sensitive request that must leave a full
TileRT pool goes to the pool predicted to finish first (TTFT + time per output token x
its expected completion: what recent streams produced, at most its max_tokens), not to the one with the earlier first token, and the debug header says
why. Simulators with different decode speeds stand in for the pools."""

from __future__ import annotations

import httpx
from queues import poll
from stack import Stack
from test_tilert_e2e import ASK, LATENCY, MODEL, SLOW_TILE, held_streams, tile_endpoint, tilert_stack

from latgate.commands.sim import SimOptions

# vllm: first token at once, then 25 ms a token; hosted: 30 ms to the first, then 2 ms
QUICK_START = SimOptions(name="vllm", ttft_overhead_ms=1.0, tpot_ms=25.0, tpot_growth_ms=0.0, default_max_tokens=8)
FAST_DECODE = SimOptions(name="hosted", ttft_overhead_ms=30.0, tpot_ms=2.0, tpot_growth_ms=0.0, default_max_tokens=8)
WARM = '[routing.policies.hosted]\nroute_to = "hosted"\n'
BUDGET = {"X-Latency-Budget-Ms": "400"}  # both pools meet it once measured (a few first tokens leave a wide spread)


def measured(stack: Stack, provider: str) -> bool:
    """Both estimates rest on evidence (a stream whose tokens came in one read has no ITL)."""
    endpoint = httpx.get(stack.url + "/admin/providers").json()["providers"][provider]["endpoints"][0]
    return endpoint["itl_observations"] >= 3 and endpoint["ttft_model"]["observations"] >= 3


def test_an_overflow_goes_to_the_pool_that_finishes_first_rather_than_the_first_token() -> None:
    with tilert_stack(SLOW_TILE, vllm=QUICK_START, hosted=FAST_DECODE, routing_extra=WARM, threshold=500) as stack:
        chat = stack.v1 + "/chat/completions"
        with httpx.Client(timeout=30) as client:
            for _ in range(8):  # ordinary traffic measures both pools' first tokens and decode
                for headers in ({}, {"X-Route-Policy": "hosted"}):
                    body = {"model": MODEL, "messages": ASK, "stream": True, "max_tokens": 8}
                    assert client.post(chat, json=body, headers=headers).status_code == 200
        poll(lambda: measured(stack, "vllm") and measured(stack, "hosted"))
        poll(lambda: tile_endpoint(stack)["capacity"] == 2)
        with held_streams(chat, 2, headers=LATENCY) as held:
            assert [r.headers["x-latgate-provider"] for r in held] == ["tile-rt", "tile-rt"]
            body = {"model": MODEL, "messages": ASK, "stream": True, "max_tokens": 64}
            explained = httpx.post(stack.url + "/admin/route", json=body, headers=BUDGET, timeout=30).json()
            answer = httpx.post(chat, json=body, headers={**BUDGET, "X-Latgate-Debug": "1"}, timeout=30)
        # the dry run (no admission hold: the plan's own capacity evidence) says the same, with its numbers
        assert (explained["provider"], explained["overflow_from"]) == ("hosted", "tile-rt"), explained
        # the streams so far produced 8 tokens: the request's max_tokens 64 bounds that expectation
        assert explained["completion_tokens"] == {"expected": 8, "from": "observed"}
        e2e = {c["provider"]: c["predicted_e2e_ms"] for c in explained["considered"]}
        assert e2e["hosted"] < e2e["vllm"], explained["considered"]
        assert answer.status_code == 200 and "data: [DONE]" in answer.text
        assert (answer.headers["x-latgate-provider"], answer.headers["x-latgate-route-reason"]) == ("hosted", "overflow:tile-rt")
        candidates = answer.headers["x-latgate-route-candidates"]
        assert "e2e for 8 completion tokens (observed)" in candidates, candidates
        assert "hosted-0" in candidates and "vllm-0" in candidates and candidates.count(" chosen") == 1, candidates
        metrics = httpx.get(stack.url + "/metrics").text
        assert 'latgate_overflows_total{from="tile-rt",to="hosted"} 1.0' in metrics, [
            line for line in metrics.splitlines() if line.startswith("latgate_overflows_total")
        ]
