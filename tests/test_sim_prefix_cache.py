"""The simulator's block-level prefix cache and compute-bound prefill.

Cached tokens are checked through a real simulator on loopback with the OpenAI SDK;
prefill accounting on virtual time (the engine's own records, no wall clock).
"""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import openai
import pytest
from servers import serve_app
from test_sim import Exchange

from latgate.commands.sim import SimOptions, VirtualClock, create_sim_app
from latgate.commands.sim.prefix_cache import BlockCache
from latgate.routing.tokens import REPLY_PRIMER_TOKENS, estimate_prompt_tokens

BLOCK = 16
CACHED = SimOptions(
    tpot_ms=0.0, tpot_growth_ms=0.0, ttft_overhead_ms=0.0, default_max_tokens=4,
    prefix_cache=True, prefix_cache_block_tokens=BLOCK,
)  # fmt: skip
SYSTEM = {"role": "system", "content": "You are a coding agent working in a large repository. " * 120}


def full_blocks_tokens(messages: list[dict]) -> int:
    """Tokens in the full blocks of these messages (what a later prompt extending them reuses)."""
    tokens = sum(estimate_prompt_tokens({"messages": [m]}) - REPLY_PRIMER_TOKENS for m in messages)
    return tokens // BLOCK * BLOCK


def turn(text: str, n: int) -> str:
    return f"{text} " + "output line of a tool run, with some numbers 12345 and paths src/a.py. " * n


def test_cached_tokens_follow_a_growing_session_and_the_metrics_count_them():
    with serve_app(create_sim_app(CACHED)) as base_url:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-none")
        history = [SYSTEM, {"role": "user", "content": turn("list the files", 30)}]
        cached, prompts, expected = [], [], [0]
        for n in range(3):
            reply = client.chat.completions.create(model="m", messages=history)
            assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            cached.append(reply.usage.prompt_tokens_details.cached_tokens)
            prompts.append(reply.usage.prompt_tokens)
            expected.append(full_blocks_tokens(history))
            history = [*history, {"role": "assistant", "content": f"step {n} done"},
                       {"role": "user", "content": turn(f"now step {n + 1}", 20)}]  # fmt: skip
        # another session with the same system prompt reuses that much only
        other = client.chat.completions.create(
            model="m", messages=[SYSTEM, {"role": "user", "content": "a different task"}], stream=True,
            stream_options={"include_usage": True},
        )
        usage = next(chunk.usage for chunk in other if chunk.usage is not None)
        assert usage.prompt_tokens_details is not None
        metrics = httpx.get(base_url + "/metrics").text

    assert cached == expected[:3]
    assert 0 < cached[1] < cached[2] < prompts[2]
    assert usage.prompt_tokens_details.cached_tokens == full_blocks_tokens([SYSTEM])
    queried = sum(prompts) + usage.prompt_tokens
    hits = sum(cached) + usage.prompt_tokens_details.cached_tokens
    assert f'vllm:prefix_cache_queries_total{{model_name="sim"}} {float(queried)}' in metrics
    assert f'vllm:prefix_cache_hits_total{{model_name="sim"}} {float(hits)}' in metrics
    assert 'vllm:cache_config_info{block_size="16",enable_prefix_caching="True"' in metrics
    assert 'kv_cache_size_tokens="1048576",num_gpu_blocks="65536"} 1.0' in metrics


def test_without_the_cache_usage_has_no_details_and_nothing_is_cached():
    with serve_app(create_sim_app(dataclasses.replace(CACHED, prefix_cache=False))) as base_url:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-none")
        for _ in range(2):
            reply = client.chat.completions.create(model="m", messages=[SYSTEM])
            assert reply.usage is not None and reply.usage.prompt_tokens_details is None
        assert "vllm:prefix_cache_hits_total" not in httpx.get(base_url + "/metrics").text


def test_the_cache_evicts_the_least_recently_used_blocks_first_and_a_prefix_last():
    cache = BlockCache(capacity_tokens=4 * BLOCK, block_tokens=BLOCK)
    a = [(b"a", BLOCK), (b"a", 2 * BLOCK), (b"a", 3 * BLOCK)]
    b = [(b"b", BLOCK), (b"b", 2 * BLOCK)]
    cache.insert(a)
    cache.insert(b)  # 5 blocks for 4: a's last block goes, its first stays
    assert cache.lookup(a, prompt_tokens=100) == 2 * BLOCK
    assert cache.lookup(b, prompt_tokens=100) == 2 * BLOCK
    cache.insert([(b"c", BLOCK), (b"c", 2 * BLOCK)])  # a was used before b: a goes
    assert cache.lookup(a, prompt_tokens=100) == 0
    assert (cache.queried_tokens, cache.hit_tokens) == (300, 4 * BLOCK)


TIMED = SimOptions(
    prefill_tokens_per_second=1000.0, ttft_overhead_ms=5.0, tpot_ms=10.0, tpot_growth_ms=0.0,
    max_batch_size=8, default_max_tokens=2, prefix_cache=True, prefix_cache_block_tokens=BLOCK,
)  # fmt: skip


def body(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "stream": True}


def run_concurrently(options: SimOptions, bodies: list[dict]):
    async def scenario():
        clock = VirtualClock()
        app = create_sim_app(options, clock=clock)
        exchanges = [Exchange(app, clock, "POST", "/v1/chat/completions", b) for b in bodies]
        await clock.run_until_idle()
        await asyncio.gather(*(e.task for e in exchanges))
        return list(app.state.sim.generations)

    return asyncio.run(scenario())


def test_one_prefill_at_a_time_makes_a_second_miss_wait_for_the_first():
    first, second = body(turn("first task", 40)), body(turn("second task", 10))
    records = run_concurrently(dataclasses.replace(TIMED, prefill_concurrency=1), [first, second])
    by_prompt = {r.prompt_tokens: r for r in records}
    a, b = by_prompt[estimate_prompt_tokens(first)], by_prompt[estimate_prompt_tokens(second)]
    assert a.cached_tokens == b.cached_tokens == 0
    assert a.prefill_seconds == pytest.approx(0.005 + a.prompt_tokens / 1000.0)
    assert (a.queue_wait_seconds, a.prefill_wait_seconds, b.queue_wait_seconds) == (0.0, 0.0, 0.0)
    assert b.prefill_wait_seconds == pytest.approx(a.prefill_seconds)
    assert b.ttft_seconds == pytest.approx(a.prefill_seconds + b.prefill_seconds)

    unlimited = run_concurrently(TIMED, [first, second])
    assert [r.prefill_wait_seconds for r in unlimited] == [0.0, 0.0]


def test_a_turn_waiting_behind_a_prefill_then_hits_what_that_prefill_cached():
    shared = turn("shared task", 40)
    records = run_concurrently(dataclasses.replace(TIMED, prefill_concurrency=1), [body(shared), body(shared)])
    first, second = records
    assert first.cached_tokens == 0
    assert second.cached_tokens == full_blocks_tokens(body(shared)["messages"]) > 0
    assert second.prefill_wait_seconds == pytest.approx(first.prefill_seconds)
    assert second.prefill_seconds == pytest.approx(0.005 + (second.prompt_tokens - second.cached_tokens) / 1000.0)
