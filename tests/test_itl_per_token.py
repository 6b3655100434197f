"""``latgate_inter_token_latency_seconds`` is observed per token: a gap between two
content chunks is divided among the tokens the chunks carried (vLLM under load puts
several tokens in one chunk)."""

from __future__ import annotations

import re

import httpx
import orjson
import pytest
from replay import ReplayScript, split_points
from stack import replay_gateway


def chunk(text: str) -> bytes:
    payload = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}  # fmt: skip
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def stream(completion_tokens: int) -> bytes:
    usage = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 3, "completion_tokens": completion_tokens, "total_tokens": 3 + completion_tokens}}  # fmt: skip
    return chunk("one two three") + chunk(" four five six") + chunk(" seven eight nine") + b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize(("completion_tokens", "samples"), [(9, 6), (3, 2)])
def test_each_gap_counts_once_per_token(completion_tokens: int, samples: int) -> None:
    """Three content chunks, read separately: 2 gaps. With usage saying 9 tokens, each
    chunk carried 3, so 6 per-token samples; with 3 tokens, one per chunk."""
    body = stream(completion_tokens)
    script = ReplayScript.sse(body, split_at=split_points(body, "events"), pause_ms=20)
    with replay_gateway(script) as (_, stack):
        request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", stack.v1 + "/chat/completions", json=request, timeout=10) as response:
            response.read()
        text = httpx.get(stack.url + "/metrics", timeout=10).text
    count = re.search(r'latgate_inter_token_latency_seconds_count\{model="[^"]*",provider="up"\} (\S+)', text)
    assert count is not None and float(count.group(1)) == samples
