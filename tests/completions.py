"""Canned chat traffic for replay-upstream tests: the request a client sends, the
non-streamed answer an upstream gives (OpenAI API reference, "The chat completion
object"), and how many requests an upstream got that the gateway proxied."""

from __future__ import annotations

from replay import ReplayServer

CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat_completion(*, prompt_tokens: int = 3, completion_tokens: int = 1) -> dict:
    """A ``chat.completion`` for model ``m`` answering "ok", with this usage (tokens)."""
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def proxied_posts(server: ReplayServer) -> int:
    """Requests ``server`` got that were proxied (active health probes are GETs)."""
    return sum(1 for r in server.requests if r.method == "POST")
