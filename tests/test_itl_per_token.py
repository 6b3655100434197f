"""``latgate_inter_token_latency_seconds`` is observed per token: a gap between two
content chunks is divided among the tokens the chunks carried (vLLM under load puts
several tokens in one chunk)."""

from __future__ import annotations

import re

import httpx
import pytest
from completions import DONE, chat_chunk, content, event, usage
from replay import ReplayScript, split_points
from stack import replay_gateway


def stream(completion_tokens: int, reads: int = 3) -> bytes:
    words = b"".join(content(f" word{i}") for i in range(reads))
    return words + event(chat_chunk(usage=usage(3, completion_tokens))) + DONE


def itl_samples(body: bytes) -> float:
    """``latgate_inter_token_latency_seconds_count`` after ``body`` was relayed, each
    event read separately."""
    script = ReplayScript.sse(body, split_at=split_points(body, "events"), pause_ms=20)
    with replay_gateway(script) as (_, stack):
        request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", stack.v1 + "/chat/completions", json=request, timeout=10) as response:
            response.read()
        text = httpx.get(stack.url + "/metrics", timeout=10).text
    count = re.search(r'latgate_inter_token_latency_seconds_count\{model="[^"]*",provider="up"\} (\S+)', text)
    assert count is not None
    return float(count.group(1))


@pytest.mark.parametrize(("completion_tokens", "samples"), [(9, 6), (3, 2)])
def test_each_gap_counts_once_per_token(completion_tokens: int, samples: int) -> None:
    """Three content chunks, read separately: 2 gaps. With usage saying 9 tokens, each
    chunk carried 3, so 6 per-token samples; with 3 tokens, one per chunk."""
    assert itl_samples(stream(completion_tokens)) == samples


@pytest.mark.parametrize("reads", [2, 3, 5, 8])
def test_per_token_samples_stay_between_the_gaps_and_the_tokens(reads: int) -> None:
    """8 tokens in ``reads`` reads: at least one sample per gap, at most 7 (the gaps
    between 8 tokens)."""
    assert reads - 1 <= itl_samples(stream(8, reads)) <= 7
