"""The gateway queue's wait prediction end to end: a cold vLLM-style pool of one slot
behind the gateway, real clients on loopback. A held slot is priced at its own request's
``max_tokens``, so a request that can wait within its budget waits instead of a 503."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from queues import held_streams, poll, simulated_pool
from stack import Stack

from latgate.commands.sim import SimOptions

CONFIG = """
[defaults]
timeout_sec = 60
max_retries = 0

[health]
load_interval_sec = 0
probe_interval_sec = 0

[providers.pool]
api_base = "{url}/v1"
models = ["m"]
max_batch_size = 1

[routing]
default_route = "pool"
expected_completion_tokens = 256
"""
# 200 ms a token: a request of 100 tokens would hold the slot 20 s; the test holds it as long
# as it needs and ends it by leaving. The gateway knows nothing of that: its pool is cold, and
# a token is priced at the prior (20 ms), so a request of 100 tokens leases the slot ~2.2 s
# and one of the default 256 tokens ~5.3 s
SLOW = SimOptions(name="pool", ttft_overhead_ms=1.0, tpot_ms=200.0, tpot_growth_ms=0.0)
ASK = [{"role": "user", "content": "hi"}]


def waiting(stack: Stack) -> int:
    return httpx.get(stack.url + "/admin/providers").json()["providers"]["pool"]["queue"]["waiting"]


def first_line(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """Stream ``body``, read up to its first line, leave: its status and headers."""
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body, headers=headers) as response:
        next(response.iter_lines(), None)
        return response.status_code, dict(response.headers)


def test_on_a_cold_pool_a_request_with_a_small_max_tokens_waits_for_the_slot_instead_of_a_503() -> None:
    body = {"model": "m", "messages": ASK, "stream": True, "max_tokens": 100}
    with simulated_pool(CONFIG, SLOW) as stack, ThreadPoolExecutor(1) as threads:
        chat = stack.v1 + "/chat/completions"
        with held_streams(chat, body):  # holds the one slot
            # 3300 ms: about 3000 ms left after the TTFT p90; the slot is predicted to free in
            # ~2.2 s (its request's 100 tokens), not ~5.3 s (256 tokens)
            newcomer = threads.submit(first_line, chat, body, {"x-latency-budget-ms": "3300"})
            poll(lambda: newcomer.done() or waiting(stack) == 1)
        status, headers = newcomer.result()
    assert status == 200, "predicted to wait past its budget: answered 503 at once"
    assert headers["x-latgate-route-reason"] == "waited:pool"
