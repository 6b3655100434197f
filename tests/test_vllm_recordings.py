"""The SSE tap on real vLLM 0.32 streams (``tests/fixtures/vllm-0.32-cpu/``, recorded from
vLLM's own server): a client that did not ask for usage gets, through the usage chunk
latgate asked for on its behalf, the bytes vLLM sends when usage is not asked for."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import orjson
import pytest
from completions import chat_completion
from replay import ReplayScript, dechunked, replay_server, split_bytes, split_points
from stack import gateway, replay_gateway, requests_total

from latgate.forwarding.sse import StreamTap

RECORDINGS = Path(__file__).parent / "fixtures" / "vllm-0.32-cpu"


def recorded_body(name: str) -> bytes:
    """The SSE body of ``NAME.raw`` with its HTTP chunked framing removed."""
    return dechunked((RECORDINGS / name).read_bytes())


def forwarded(body: bytes, pieces: list[int], **options: object) -> bytes:
    tap = StreamTap(**options)
    out = b""
    for piece in split_bytes(body, pieces):
        data, _ = tap.feed(piece)
        out += data
    return out + tap.flush()[0]


def _without_id(body: bytes) -> bytes:
    return body.replace(b"chatcmpl-a1cb0f9a1d8d02ff", b"ID").replace(b"chatcmpl-b5af746a2e0e49ca", b"ID")


@pytest.mark.parametrize("how", ["whole", "events", "bytes", "random"])
def test_hidden_usage_chunk_gives_the_stream_vllm_sends_without_usage(how: str) -> None:
    """The usage chunk is dropped and its ``system_fingerprint`` lands on the terminal
    chunk, byte for byte where vLLM writes it without usage (same generation, seeded)."""
    with_usage = recorded_body("chat_stream_usage.raw")
    without = recorded_body("chat_stream_nousage.raw")
    points = [] if how == "whole" else split_points(with_usage, how, seed=3)
    out = forwarded(with_usage, points, drop_usage_chunk=True)
    assert _without_id(out) == _without_id(without)
    assert b'"usage"' not in out


def test_usage_stays_visible_to_a_client_that_asked() -> None:
    body = recorded_body("chat_stream_usage.raw")
    tap = StreamTap()
    out, _ = tap.feed(body)
    assert out == body
    assert tap.usage == {"prompt_tokens": 12, "total_tokens": 28, "completion_tokens": 16}


def test_hidden_usage_is_still_counted() -> None:
    tap = StreamTap(drop_usage_chunk=True)
    tap.feed(recorded_body("chat_stream_usage.raw"))
    assert tap.usage == {"prompt_tokens": 12, "total_tokens": 28, "completion_tokens": 16}
    assert tap.done


def test_a_terminal_chunk_is_held_only_until_the_next_event() -> None:
    """An upstream that sends no usage chunk after all: the terminal chunk goes out
    unchanged with ``[DONE]`` (or at the end of the stream)."""
    body = recorded_body("chat_stream_nousage.raw")
    assert forwarded(body, split_points(body, "events", seed=1), drop_usage_chunk=True) == body
    cut = body[: body.rindex(b"data: [DONE]")]
    assert forwarded(cut, [], drop_usage_chunk=True) == cut


def _post_stream(url: str, body: dict) -> bytes:
    with httpx.Client(timeout=10) as client, client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        return response.read()


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_a_client_that_did_not_ask_gets_vllms_no_usage_stream_through_latgate() -> None:
    with replay_gateway(ReplayScript.sse(recorded_body("chat_stream_usage.raw"))) as (upstream, stack):
        out = _post_stream(stack.v1 + "/chat/completions", CHAT)
        assert upstream.requests[0].json()["stream_options"] == {"include_usage": True}
    assert _without_id(out) == _without_id(recorded_body("chat_stream_nousage.raw"))


def test_an_explicit_include_usage_false_is_sent_as_written_and_counted_as_an_estimate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = recorded_body("chat_stream_nousage.raw")
    caplog.set_level(logging.INFO, logger="latgate.access")
    with replay_gateway(ReplayScript.sse(body)) as (upstream, stack):
        out = _post_stream(stack.v1 + "/chat/completions", {**CHAT, "stream_options": {"include_usage": False}})
        assert upstream.requests[0].json()["stream_options"] == {"include_usage": False}
    assert out == body
    line = next(orjson.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access")
    assert line["usage_estimated"] is True
    assert line["completion_tokens"] > 0


def _aborted_stream() -> bytes:
    """vLLM's no-usage stream with its last chunk ending in ``abort`` (as vLLM ends an
    in-flight stream on shutdown)."""
    body = recorded_body("chat_stream_nousage.raw")
    return body.replace(b'"finish_reason":"length"', b'"finish_reason":"abort"')


def test_a_stream_the_engine_aborted_is_relayed_as_written_and_counted_failed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    with replay_gateway(ReplayScript.sse(_aborted_stream())) as (_, stack):
        out = _post_stream(stack.v1 + "/chat/completions", {**CHAT, "stream_options": {"include_usage": False}})
        assert requests_total(stack.url, "502") == 1
        assert requests_total(stack.url, "200") == 0
    assert out == _aborted_stream()
    line = next(orjson.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access")
    assert line["error"] == "aborted"


RETRY_ONCE = """
[defaults]
timeout_sec = 10
max_retries = 1
[providers.up]
api_base = "{base}"
"""


def test_a_non_streamed_answer_the_engine_aborted_is_retried() -> None:
    aborted = {**chat_completion(), "choices": [{"index": 0, "message": {"role": "assistant", "content": "tru"}, "finish_reason": "abort"}]}
    scripts = [ReplayScript.json_response(200, aborted), ReplayScript.json_response(200, chat_completion())]
    with replay_server(scripts) as upstream, gateway(RETRY_ONCE.format(base=upstream.base_url)) as stack:
        answer = httpx.post(stack.v1 + "/chat/completions", json={**CHAT, "stream": False}, timeout=10)
        assert len(upstream.requests) == 2
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["finish_reason"] == "stop"


def test_a_terminal_chunk_held_for_the_usage_chunk_is_released_when_the_upstream_breaks_off() -> None:
    body = recorded_body("chat_stream_usage.raw")
    cut = body[: body.index(b'data: {"id":"chatcmpl-a1cb0f9a1d8d02ff","object":"chat.completion.chunk","created":1796112720,"model":"tiny","choices":[],')]
    tap = StreamTap(drop_usage_chunk=True)
    out, _ = tap.feed(cut)
    assert b'"finish_reason":"length"' not in out
    released = tap.release_held()
    assert out + released == cut
    assert tap.release_held() == b""
