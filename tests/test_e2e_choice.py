"""Choosing by predicted end-to-end latency (TTFT + ITL x expected completion tokens)
for requests with a TTFT budget, on plain data: the policy with literals, the selector
over a live pool on an injected clock (the Rig of ``test_evidence``), each endpoint's
TTFT and time per output token given by the test."""

from __future__ import annotations

import collections
import random

from test_evidence import Rig, SlowFirst, same

from latgate.routing.policies.e2e import expected_completion_tokens, predicted_e2e_ms
from latgate.routing.policies.predicted_ttft import choose_power_of_two
from latgate.routing.policies.view import EndpointView as V

BUDGETED = {"x-latency-budget-ms": "500"}  # a budget, above the threshold: routed by its rule to vllm
TWO_POOLS = """
[providers.steady]
endpoints = ["http://s0:1/v1"]
connector = "vllm"
models = ["m"]
[routing.policies.steady]
route_to = "steady"
[routing.fallbacks]
decode = ["vllm", "steady"]
[providers.decode.hints]
max_num_seqs = 1
"""


def test_expected_completion_tokens_come_from_the_request_else_the_default() -> None:
    assert expected_completion_tokens({"max_completion_tokens": 40, "max_tokens": 900}, default_tokens=256) == (40, "max_completion_tokens")
    assert expected_completion_tokens({"max_output_tokens": 12}, default_tokens=256) == (12, "max_output_tokens")
    assert expected_completion_tokens({"max_tokens": True}, default_tokens=256) == (256, "default")
    assert expected_completion_tokens({"max_tokens": 0}, default_tokens=99) == (99, "default")
    assert expected_completion_tokens({}, default_tokens=99, observed_tokens=41.6) == (42, "observed")
    assert expected_completion_tokens({"max_tokens": 7}, default_tokens=99, observed_tokens=41.6) == (7, "max_tokens")
    assert predicted_e2e_ms(ttft_ms=20.0, itl_ms=22.0, completion_tokens=256) == 20.0 + 22.0 * 255
    assert predicted_e2e_ms(ttft_ms=20.0, itl_ms=22.0, completion_tokens=1) == 20.0


def test_with_a_budget_the_endpoint_is_ranked_by_e2e_among_those_meeting_it() -> None:
    quick_start = V(predicted_ttft_ms=10.0, p90_ttft_ms=20.0, predicted_e2e_ms=5000.0)
    fast_decode = V(predicted_ttft_ms=60.0, p90_ttft_ms=90.0, predicted_e2e_ms=700.0)
    assert choose_power_of_two([quick_start, fast_decode], draws=(0, 0)) == 0, "no budget: TTFT"
    assert choose_power_of_two([quick_start, fast_decode], draws=(0, 0), budget_ms=200) == 1
    late = V(predicted_ttft_ms=260.0, p90_ttft_ms=300.0, predicted_e2e_ms=400.0)
    assert choose_power_of_two([quick_start, late], draws=(0, 0), budget_ms=200) == 0, "a TTFT miss is not a candidate"
    close = [V(predicted_e2e_ms=700.0, in_flight=2), V(predicted_e2e_ms=760.0)]
    assert choose_power_of_two(close, draws=(0, 0), budget_ms=200) == 1, "close e2e: load decides"


def test_cold_replicas_without_itl_evidence_split_budgeted_traffic_evenly() -> None:
    rig = Rig(vllm=2)
    noise = random.Random(5)
    picks = collections.Counter(
        rig.send(same(7.0), headers=BUDGETED, itl_ms=lambda e: 20.0 + noise.random()).endpoint.config.id for _ in range(40)
    )
    assert abs(picks["vllm-0"] - picks["vllm-1"]) <= 2, picks
    concurrent: collections.Counter[str] = collections.Counter()
    for _ in range(10):
        for _ in range(8):
            concurrent[rig.send(same(7.0), headers=BUDGETED, hold=True).endpoint.config.id] += 1
        rig.release_all()
    assert concurrent["vllm-0"] == concurrent["vllm-1"] == 40, concurrent


def test_a_replica_without_itl_evidence_is_predicted_like_its_measured_peers() -> None:
    rig = Rig(vllm=3)
    fast = lambda e: 4.0
    for endpoint in ("vllm-0", "vllm-1"):
        ep = next(e for e in rig.pool["vllm"].endpoints if e.config.id == endpoint)
        for _ in range(3):
            ep.observe_itl(4.0, now=rig.clock.now)
    picks = collections.Counter(rig.send(same(7.0), headers=BUDGETED, itl_ms=fast).endpoint.config.id for _ in range(60))
    assert min(picks.values()) >= 15 and len(picks) == 3, picks


def test_a_replica_that_decoded_slowly_for_a_while_gets_its_share_back() -> None:
    rig = Rig(vllm=2)
    itl = SlowFirst("vllm-1", count=5, slow_ms=200.0, normal_ms=20.0)
    while itl.left:
        rig.send(same(7.0), itl_ms=itl)  # ordinary traffic: the slow streams are measured
    picks = collections.Counter(rig.send(same(7.0), headers=BUDGETED, itl_ms=itl).endpoint.config.id for _ in range(200))
    assert picks["vllm-1"] >= 70, picks  # within the exploration share, then an even split


def test_an_overflow_goes_to_the_pool_predicted_to_finish_first_not_the_first_token() -> None:
    rig = Rig(vllm=1, extra=TWO_POOLS)
    for _ in range(4):  # measured: vllm starts fast and decodes slowly, steady the other way round
        rig.send(same(5.0), itl_ms=same(25.0))
        rig.send(same(60.0), itl_ms=same(1.0), headers={"x-route-policy": "steady"})
    ls = {"x-latency-sensitive": "1", "x-latgate-debug": "1"}
    rig.send(same(5.0), headers=ls, hold=True)  # holds the decode pool's only slot
    plan = rig.send(same(5.0), headers=ls, max_tokens=64)
    assert plan.targets[0].provider == "steady" and plan.targets[0].reason == "overflow:decode"
    header = plan.explain_header()
    assert "e2e for 64 completion tokens (max_tokens)" in header and "left decode: capacity" in header, header
    short = rig.send(same(5.0), headers=ls, max_tokens=1)
    assert short.targets[0].provider == "vllm", "one token: e2e is the first token"
    uncapped = rig.send(same(5.0), headers=ls)  # no max_tokens: the streams' length so far (256 each here)
    assert uncapped.targets[0].provider == "steady" and "e2e for 256 completion tokens (observed)" in uncapped.explain_header()
