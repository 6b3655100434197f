"""The gateway queue end to end: a full vLLM-style pool (``max_batch_size``) behind the
gateway, real clients on loopback; classes, shedding on every route, preemption before
the first byte, a key's priority ceiling, and the TileRT stand-in's burst."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest
from queues import held_streams, poll, simulated_pool
from stack import FAST, Stack, gateway, requests_total_in, simulators

from latgate.commands.sim import SimOptions

MODEL = "m"
ASK = [{"role": "user", "content": "hi"}]
CONFIG = """
[defaults]
timeout_sec = 30
max_retries = 0

[health]
load_interval_sec = 0
probe_interval_sec = 0

[providers.vllm]
api_base = "{url}/v1"
models = ["m"]
max_batch_size = 1

[routing]
default_route = "vllm"

[routing.queue]
{queue}
{extra}
"""
KEYS = """
[[auth.keys]]
name = "capped"
key = "sk-capped"
priority = "batch"

[[auth.keys]]
name = "free"
key = "sk-free"
admin = true
"""
SLOW = SimOptions(name="vllm", ttft_overhead_ms=1.0, tpot_ms=20.0, tpot_growth_ms=0.0, max_output_tokens=400)


@contextlib.contextmanager
def pool_stack(sim: SimOptions = SLOW, *, queue: str = "", extra: str = "") -> Iterator[Stack]:
    """One vLLM-style simulator with one batch slot behind a gateway."""
    with simulated_pool(CONFIG, sim, queue=queue, extra=extra) as stack:
        yield stack


def queue_of(stack: Stack) -> dict[str, Any]:
    admin = httpx.get(stack.url + "/admin/providers", headers={"Authorization": "Bearer sk-free"})
    return admin.json()["providers"]["vllm"]["queue"]


@contextlib.contextmanager
def slot_taken(stack: Stack, *, headers: dict[str, str] | None = None) -> Iterator[None]:
    """The pool's one slot held by a long stream through the gateway, until the block ends."""
    body = {"model": MODEL, "messages": ASK, "stream": True, "max_tokens": 400}
    with held_streams(stack.v1 + "/chat/completions", body, headers=headers):
        yield


ROUTES = [
    ("/chat/completions", {"model": MODEL, "messages": ASK}),
    ("/completions", {"model": MODEL, "prompt": "hi"}),
    ("/messages", {"model": MODEL, "messages": ASK, "max_tokens": 8}),
    ("/responses", {"model": MODEL, "input": "hi"}),
]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[r[0] for r in ROUTES])
def test_a_shed_batch_request_gets_503_with_retry_after_in_its_apis_envelope(path: str, body: dict[str, Any]) -> None:
    with pool_stack(queue="batch_max_wait_ms = 1") as stack, slot_taken(stack):
        r = httpx.post(stack.v1 + path, json=body, headers={"X-Latgate-Priority": "batch"}, timeout=30)
        metrics = httpx.get(stack.url + "/metrics").text
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) >= 1
    error = r.json()["error"]
    if path == "/messages":
        assert r.json()["type"] == "error" and error["type"] == "overloaded_error"
    else:
        assert error["code"] == "queue_full"
    assert "at capacity" in error["message"] and "batch request not queued" in error["message"]
    assert 'latgate_queue_wait_seconds_count{outcome="shed",priority="batch",provider="vllm"} 1.0' in metrics
    assert requests_total_in(metrics, 503, provider="vllm") == 0, "latgate's own 503 is not the provider's 5xx"
    assert requests_total_in(metrics, 503, provider="none") == 1


def test_on_a_full_pool_an_interactive_request_waits_less_than_the_batch_requests_queued_before_it() -> None:
    # the second batch request is predicted to wait the held stream's lease and one more (a
    # prior of ~5 s each before any is observed): a bound of 30 s so that neither is shed
    with pool_stack(queue="batch_max_wait_ms = 30000") as stack, ThreadPoolExecutor(3) as threads:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 4}
        chat = stack.v1 + "/chat/completions"
        with slot_taken(stack):
            batch = [threads.submit(httpx.post, chat, json=body, headers={"X-Latgate-Priority": "batch"}, timeout=30) for _ in range(2)]
            poll(lambda: queue_of(stack)["waiting_by_priority"]["batch"] == 2)
            interactive = threads.submit(httpx.post, chat, json=body, headers={"X-Latgate-Priority": "interactive"}, timeout=30)
            poll(lambda: queue_of(stack)["waiting_by_priority"]["interactive"] == 1)
        answers = [f.result() for f in (interactive, *batch)]
        depth = httpx.get(stack.url + "/metrics").text
        ui = httpx.get(stack.url + "/ui/state").json()["providers"]["vllm"]["queue"]
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert all(r.headers["x-latgate-route-reason"] == "waited:vllm" for r in answers)
    waits = [int(r.headers["x-latgate-queue-ms"]) for r in answers]
    assert waits[0] < min(waits[1:]), f"interactive first, though it came last: {waits}"
    assert 'latgate_queue_depth{priority="batch",provider="vllm"} 0.0' in depth
    assert (ui["admitted"], ui["waiting"]) == (3, 0), "the /ui page shows the queue"


def preempt_one(queue: str) -> tuple[httpx.Response, httpx.Response, dict[str, Any]]:
    """A batch stream admitted and waiting for its first token, then an interactive
    request with a budget it can meet only with that slot: (interactive, batch, queue)."""
    slow_first_token = SimOptions(name="vllm", ttft_overhead_ms=1500.0, tpot_ms=1.0, default_max_tokens=4)
    with pool_stack(slow_first_token, queue=queue) as stack, ThreadPoolExecutor(2) as threads:
        chat = stack.v1 + "/chat/completions"
        body = {"model": MODEL, "messages": ASK, "stream": True}
        batch = threads.submit(
            httpx.post, chat, json=body, headers={"X-Latgate-Priority": "batch"}, timeout=30
        )
        in_flight = lambda: httpx.get(stack.url + "/admin/providers").json()["providers"]["vllm"][
            "endpoints"
        ][0]["in_flight"]
        poll(lambda: in_flight() == 1)  # admitted, waiting for its first token
        interactive = httpx.post(
            chat,
            json=body,
            headers={"X-Latgate-Priority": "interactive", "X-Latency-Budget-Ms": "3000"},
            timeout=30,
        )
        return interactive, batch.result(), queue_of(stack)


def test_a_preempted_batch_request_goes_back_to_the_queue_and_is_answered_whole_after_the_interactive_one() -> (
    None
):
    interactive, preempted, admin = preempt_one("batch_max_wait_ms = 30000")
    assert interactive.status_code == 200 and interactive.text.rstrip().endswith("data: [DONE]"), (
        interactive.text
    )
    assert preempted.status_code == 200, preempted.text
    assert preempted.text.rstrip().endswith("data: [DONE]"), "answered whole by its retry, never a cut stream"
    assert preempted.text.count("data: {") == interactive.text.count("data: {"), (
        "one answer, not a partial one and another"
    )
    assert admin["preempted"] == 1 and admin["admitted"] >= 1


def test_a_preempted_batch_request_whose_bound_is_over_gets_a_503_before_any_byte() -> None:
    interactive, preempted, admin = preempt_one("batch_max_wait_ms = 1")
    assert interactive.status_code == 200 and interactive.text.rstrip().endswith("data: [DONE]"), (
        interactive.text
    )
    assert preempted.status_code == 503, "never a 200 with a cut stream"
    assert preempted.headers["x-latgate-preempted"] == "1" and int(preempted.headers["retry-after"]) >= 1
    assert preempted.json()["error"]["code"] == "preempted" and "data:" not in preempted.text
    assert admin["preempted"] == 1


def test_no_batch_request_is_preempted_for_an_interactive_one_that_cannot_meet_its_budget_anyway_it_is_served_late() -> None:
    slow_first_token = SimOptions(name="vllm", ttft_overhead_ms=1500.0, tpot_ms=1.0, default_max_tokens=4)
    with pool_stack(slow_first_token) as stack, ThreadPoolExecutor(2) as threads:
        chat = stack.v1 + "/chat/completions"
        body = {"model": MODEL, "messages": ASK, "stream": True}
        batch = threads.submit(httpx.post, chat, json=body, headers={"X-Latgate-Priority": "batch"}, timeout=30)
        in_flight = lambda: httpx.get(stack.url + "/admin/providers").json()["providers"]["vllm"]["endpoints"][0]["in_flight"]
        poll(lambda: in_flight() == 1)  # admitted, waiting for its first token
        # 1 ms cannot cover even the first token's time: a freed slot would not help it
        hopeless = httpx.post(chat, json=body, headers={"X-Latgate-Priority": "interactive", "X-Latency-Budget-Ms": "1"}, timeout=30)
        kept = batch.result()
        admin = queue_of(stack)
    assert kept.status_code == 200 and kept.text.rstrip().endswith("data: [DONE]"), kept.text
    assert admin["preempted"] == 0
    # a budget is a preference: with nowhere else to go it waited for the slot and was served late
    assert hopeless.status_code == 200 and hopeless.text.rstrip().endswith("data: [DONE]"), hopeless.text
    assert hopeless.headers["x-latgate-route-reason"] == "late:vllm"
    assert admin["late"] == 1 and admin["shed"] == 0


def test_a_keys_priority_ceiling_caps_what_its_clients_claim() -> None:
    with pool_stack(queue="batch_max_wait_ms = 1", extra=KEYS) as stack:
        capped = openai.OpenAI(base_url=stack.v1, api_key="sk-capped", max_retries=0)
        free = openai.OpenAI(base_url=stack.v1, api_key="sk-free", max_retries=0)
        claim = {"X-Latgate-Priority": "interactive"}
        with slot_taken(stack, headers={"Authorization": "Bearer sk-free"}), ThreadPoolExecutor(1) as threads:
            with pytest.raises(openai.APIStatusError) as shed:
                capped.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, extra_headers=claim)
            waiting = threads.submit(free.chat.completions.with_raw_response.create, model=MODEL, messages=ASK, max_tokens=4, extra_headers=claim)
            poll(lambda: queue_of(stack)["waiting_by_priority"]["interactive"] == 1)
        answered = waiting.result()
    assert shed.value.status_code == 503 and "batch request not queued" in shed.value.message
    assert answered.headers["x-latgate-route-reason"] == "waited:vllm"


def test_an_anthropic_client_sees_its_overloaded_error_when_shed() -> None:
    with pool_stack(queue="batch_max_wait_ms = 1") as stack, slot_taken(stack):
        client = anthropic.Anthropic(base_url=stack.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as shed:
            client.messages.create(
                model=MODEL, messages=ASK, max_tokens=8, extra_headers={"X-Latgate-Priority": "batch"}
            )
    assert shed.value.status_code == 503 and shed.value.response.headers["retry-after"]


def test_a_request_the_pool_has_room_for_does_not_wait_or_say_so() -> None:
    with pool_stack(SimOptions(name="vllm", **FAST)) as stack:
        r = httpx.post(stack.v1 + "/chat/completions", json={"model": MODEL, "messages": ASK}, headers={"X-Latgate-Priority": "batch"})
    assert r.status_code == 200 and "x-latgate-queue-ms" not in r.headers


def test_an_unknown_priority_is_a_400_naming_the_header() -> None:
    with pool_stack(SimOptions(name="vllm", **FAST)) as stack:
        r = httpx.post(stack.v1 + "/chat/completions", json={"model": MODEL, "messages": ASK}, headers={"X-Latgate-Priority": "urgent"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Latgate-Priority"


BUDGET = """
[defaults]
timeout_sec = 30
max_retries = 2

[health]
load_interval_sec = 0
probe_interval_sec = 0
failure_threshold = 100

[providers.failing]
api_base = "{failing}/v1"
models = ["m"]

[providers.healthy]
api_base = "{healthy}/v1"
models = ["m"]

[routing]
default_route = "failing"
fallbacks = {{ "failing" = ["healthy"] }}

[routing.queue]
{queue}
"""


@pytest.mark.parametrize(("queue", "attempts_on_failing"), [("", 3), ("retry_budget_percent = 0\nretry_budget_min = 0", 1)])
def test_over_the_retry_budget_a_failure_goes_on_to_the_next_provider_without_retrying(queue: str, attempts_on_failing: int) -> None:
    options = {"failing": SimOptions(name="failing", error_rate=1.0, seed=1, **FAST), "healthy": SimOptions(name="healthy", **FAST)}
    with simulators(options) as sims:
        config = BUDGET.format(failing=sims["failing"][0], healthy=sims["healthy"][0], queue=queue)
        with gateway(config) as stack:
            r = httpx.post(stack.v1 + "/chat/completions", json={"model": MODEL, "messages": ASK}, timeout=30)
            metrics = httpx.get(stack.url + "/metrics").text
    assert r.status_code == 200 and r.headers["x-latgate-provider"] == "healthy"
    assert sims["failing"][1].stats.requests_total == attempts_on_failing
    denied = 'latgate_retry_budget_exceeded_total{kind="retry",provider="failing"} 1.0' in metrics
    assert denied == (attempts_on_failing == 1)


def test_a_held_batch_stream_preempted_mid_generation_is_answered_whole_by_its_retry_never_half_streamed() -> None:
    # a first token after 500 ms: the second batch stream is queued (a backlog) before the
    # first one's content comes, so that one is held back, preemptible, while it generates
    sim = SimOptions(name="vllm", ttft_overhead_ms=500.0, tpot_ms=20.0, tpot_growth_ms=0.0, max_output_tokens=400)
    with pool_stack(sim, queue="batch_max_wait_ms = 30000") as stack, ThreadPoolExecutor(2) as threads:
        chat = stack.v1 + "/chat/completions"
        body = {"model": MODEL, "messages": ASK, "stream": True, "max_tokens": 40}
        endpoint = lambda: httpx.get(stack.url + "/admin/providers").json()["providers"]["vllm"]["endpoints"][0]
        batch = [threads.submit(httpx.post, chat, json=body, headers={"X-Latgate-Priority": "batch"}, timeout=30)]
        poll(lambda: endpoint()["in_flight"] == 1)
        batch.append(threads.submit(httpx.post, chat, json=body, headers={"X-Latgate-Priority": "batch"}, timeout=30))
        poll(lambda: queue_of(stack)["waiting_by_priority"]["batch"] == 1)
        poll(lambda: endpoint()["ttft_model"]["observations"] == 1)  # the first one's content reached latgate
        interactive = httpx.post(
            chat, json={**body, "max_tokens": 4}, headers={"X-Latgate-Priority": "interactive"}, timeout=30
        )
        answers = [f.result() for f in batch]
        admin = queue_of(stack)
        disconnects = stack.sims["vllm"].state.sim.disconnects
    assert interactive.status_code == 200 and interactive.text.rstrip().endswith("data: [DONE]"), interactive.text
    assert admin["preempted"] == 1, "the held stream gave its slot up"
    assert disconnects == 1, "its upstream connection was closed: the engine stopped generating it"
    for answer in answers:
        assert answer.status_code == 200, answer.text
        chunks = [line for line in answer.text.splitlines() if line.startswith("data: {")]
        assert answer.text.count("data: [DONE]") == 1 and answer.text.rstrip().endswith("data: [DONE]")
        assert sum('"content"' in chunk for chunk in chunks) <= 41 and answer.text.count('"role"') == 1, (
            "one whole answer, not the preempted attempt's start and then its retry"
        )
