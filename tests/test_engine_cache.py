"""An engine's prefix-cache facts read from its real ``/metrics`` page (vLLM 0.32 CPU
recordings; SGLang's gauges as its collector writes them), and the cached prompt tokens
read from answers' usage."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import orjson
import pytest
from replay import ReplayScript
from stack import replay_gateway
from test_vllm_recordings import recorded_body

from latgate.forwarding.usage import cached_prompt_tokens
from latgate.live.providers.engine_cache import (
    EngineCacheFacts,
    parse_engine_cache,
    parse_sglang_cache,
    parse_vllm_cache,
)

FIXTURES = Path(__file__).parent / "fixtures"
VLLM = FIXTURES / "vllm-0.32-cpu"


def test_vllm_cache_config_gives_capacity_block_size_and_counters() -> None:
    facts = parse_vllm_cache((VLLM / "metrics_sample.txt").read_text())
    assert facts == EngineCacheFacts(
        capacity_tokens=8192 * 128,
        block_size_tokens=128,
        prefix_caching=True,
        queried_tokens=72.0,
        hit_tokens=0.0,
        usage_fraction=0.0,
    )


TWO_ENGINES_OLD_NAMES = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
    'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="1000"} 1.0',
    'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="1",num_gpu_blocks="1000"} 1.0',
    'vllm:gpu_prefix_cache_queries_total{engine="0"} 300.0',
    'vllm:gpu_prefix_cache_queries_total{engine="1"} 100.0',
    'vllm:gpu_prefix_cache_hits_total{engine="0"} 160.0',
    'vllm:gpu_cache_usage_perc{engine="0"} 0.25',
    'vllm:gpu_cache_usage_perc{engine="1"} 0.5',
)


def test_vllm_engines_of_one_server_are_summed_and_older_names_are_read() -> None:
    page = "\n".join(TWO_ENGINES_OLD_NAMES)
    facts = parse_vllm_cache(page)
    assert facts is not None
    assert (facts.capacity_tokens, facts.block_size_tokens) == (32_000, 16)
    assert (facts.queried_tokens, facts.hit_tokens, facts.usage_fraction) == (400.0, 160.0, 0.5)


def test_vllm_with_prefix_caching_off_says_so() -> None:
    page = 'vllm:cache_config_info{block_size="16",enable_prefix_caching="False",num_gpu_blocks="10"} 1.0\n'
    facts = parse_vllm_cache(page)
    assert facts is not None and facts.prefix_caching is False and facts.capacity_tokens == 160


@pytest.mark.parametrize(
    "page",
    [
        "",
        "# HELP vllm:cache_config_info x\n",
        'vllm:num_requests_running{model_name="m"} 1.0\n',
        "vllm:prefix_cache_queries_total_other 3\n",  # a longer name is not the counter
        'vllm:prefix_cache_hits_total{engine="0"} not-a-number\n',
    ],
)
def test_a_page_without_cache_facts_gives_none(page: str) -> None:
    assert parse_vllm_cache(page) is None


def test_malformed_config_labels_leave_capacity_unknown() -> None:
    page = 'vllm:cache_config_info{block_size="None",num_gpu_blocks="-1"} 1.0\nvllm:kv_cache_usage_perc 0.1\n'
    facts = parse_vllm_cache(page)
    assert facts is not None and facts.capacity_tokens is None and facts.usage_fraction == 0.1


def test_sglang_gauges_give_capacity_usage_and_hit_ratio() -> None:
    facts = parse_sglang_cache((FIXTURES / "sglang" / "metrics_cache.txt").read_text())
    assert facts == EngineCacheFacts(capacity_tokens=512_000, hit_ratio=0.8125, usage_fraction=0.12)


def test_the_parser_follows_the_connector() -> None:
    text = (VLLM / "metrics_sample.txt").read_text()
    assert parse_engine_cache("vllm", text) == parse_vllm_cache(text)
    assert parse_engine_cache("openai", text) is None
    assert parse_engine_cache("vllm", None) is None


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        (
            {"prompt_tokens": 900, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 768}},
            768,
        ),
        ({"prompt_tokens": 900, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}}, 0),
        ({"prompt_tokens": 900, "completion_tokens": 4}, None),  # vLLM leaves the details out
        ({"prompt_tokens": 9, "completion_tokens": 3, "prompt_tokens_details": None}, None),  # SGLang
        (
            {"input_tokens": 50, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 32}},
            32,
        ),  # Responses
        ({"input_tokens": 12, "output_tokens": 2, "cache_read_input_tokens": 4096}, 4096),  # Anthropic
        ({"prompt_tokens_details": {"cached_tokens": "768"}}, None),
        ({"prompt_tokens_details": {"cached_tokens": -1}}, None),
        ({"prompt_tokens_details": {"cached_tokens": True}}, None),
        ("usage", None),
        (None, None),
    ],
)
def test_cached_prompt_tokens_of_a_usage_object(usage: object, cached: int | None) -> None:
    assert cached_prompt_tokens(usage) == cached


def _access_line(caplog: pytest.LogCaptureFixture) -> dict:
    return next(orjson.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access")


CACHED_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "def main():"}], "max_tokens": 3}


def test_a_streamed_answers_cached_tokens_reach_the_access_log(caplog: pytest.LogCaptureFixture) -> None:
    """vLLM 0.32 with --enable-prompt-tokens-details, recorded: 256 of 317 prompt tokens cached."""
    caplog.set_level(logging.INFO, logger="latgate.access")
    with replay_gateway(ReplayScript.sse(recorded_body("chat_stream_cached.raw"))) as (_, stack):
        body = {**CACHED_CHAT, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", stack.v1 + "/chat/completions", json=body, timeout=10) as response:
            assert response.status_code == 200
            response.read()
    line = _access_line(caplog)
    assert (line["prompt_tokens"], line["cached_prompt_tokens"]) == (317, 256)


def test_a_non_streamed_answers_cached_tokens_reach_the_access_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    answer = orjson.loads((VLLM / "chat_cached.json").read_bytes())
    with replay_gateway(ReplayScript.json_response(200, answer)) as (_, stack):
        response = httpx.post(stack.v1 + "/chat/completions", json=CACHED_CHAT, timeout=10)
    assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 256
    line = _access_line(caplog)
    assert (line["prompt_tokens"], line["cached_prompt_tokens"]) == (317, 256)


def test_an_answer_without_details_logs_no_cached_tokens(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    with replay_gateway(ReplayScript.sse(recorded_body("chat_stream_usage.raw"))) as (_, stack):
        body = {**CACHED_CHAT, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", stack.v1 + "/chat/completions", json=body, timeout=10) as response:
            response.read()
    assert "cached_prompt_tokens" not in _access_line(caplog)
