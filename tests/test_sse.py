"""The SSE tap: any split of a recorded upstream stream into reads forwards the same
bytes (comments as a bare ``:``) and derives the same facts (content chunks, usage,
[DONE], in-band error)."""

from __future__ import annotations

import orjson
import pytest
from completions import content
from replay import load_expect, load_stream, split_bytes, split_points, stream_fixture_names
from sse_tap import as_forwarded, tap_pieces

from latgate.forwarding.sse import StreamTap

SPLITS = ["events", "bytes", "utf8", "crlf", "random"]



@pytest.mark.parametrize("how", SPLITS)
@pytest.mark.parametrize("name", stream_fixture_names())
def test_any_split_forwards_the_same_bytes_and_counts(name: str, how: str) -> None:
    body = load_stream(name)
    expect = load_expect(name)
    tap = StreamTap()
    forwarded, units = tap_pieces(split_bytes(body, split_points(body, how, seed=7)), tap)
    if expect.error is None:
        assert forwarded == as_forwarded(body)
    else:  # an error event, and anything after it, is never forwarded (the relay sends a redacted one)
        events = [e for e in body.split(b"\n\n") if e]
        kept = events[: next(i for i, e in enumerate(events) if b'"error"' in e)]
        assert forwarded == (b"\n\n".join(kept) + b"\n\n" if kept else b"")
    assert units == tap.content_chunks == expect.content_chunks
    assert tap.done is expect.done
    if expect.usage is None:
        assert tap.usage is None
    else:
        assert {k: tap.usage[k] for k in ("prompt_tokens", "completion_tokens")} == expect.usage
    assert (tap.error is not None) == (expect.error is not None)


@pytest.mark.parametrize("seed", range(20))
def test_random_splits_of_a_crlf_stream_are_stable(seed: int) -> None:
    body = load_stream("vllm_chat_crlf")
    tap = StreamTap()
    forwarded, units = tap_pieces(split_bytes(body, split_points(body, "random", seed=seed, count=40)), tap)
    assert forwarded == body
    assert units == load_expect("vllm_chat_crlf").content_chunks


def test_usage_chunk_latgate_asked_for_is_kept_from_the_client() -> None:
    body = load_stream("vllm_chat")
    tap = StreamTap(drop_usage_chunk=True)
    forwarded, _ = tap_pieces(split_bytes(body, split_points(body, "bytes")), tap)
    assert b'"choices":[]' in body
    assert b'"choices":[]' not in forwarded
    assert forwarded.endswith(b"data: [DONE]\n\n")
    assert tap.usage is not None and tap.usage["completion_tokens"] == load_expect("vllm_chat").usage["completion_tokens"]
    # everything else is forwarded unchanged, in order
    events = [e for e in body.split(b"\n\n") if e and b'"choices":[]' not in e]
    assert forwarded == b"\n\n".join(events) + b"\n\n"


def test_model_name_is_rewritten_to_the_alias_the_client_asked_for() -> None:
    body = load_stream("vllm_chat")
    served = orjson.loads(body.split(b"\n\n")[0][6:])["model"]
    tap = StreamTap(model_rewrite=(served, "my-alias"))
    forwarded, _ = tap_pieces([body], tap)
    assert served.encode() not in forwarded
    assert forwarded.count(b'"model":"my-alias"') == body.count(b'"model":' + orjson.dumps(served))


def test_role_only_and_empty_finish_chunks_are_not_content() -> None:
    tap = StreamTap()
    _, units = tap_pieces(
        [
            b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
            b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
            b": keep-alive\n\n",
        ],
        tap,
    )
    assert units == 0 and tap.events == 3


def test_a_trailing_event_without_its_blank_line_is_forwarded_at_end_of_stream() -> None:
    tap = StreamTap()
    forwarded, units = tap_pieces([b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}'], tap)
    assert forwarded == b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}'
    assert units == 1


def test_data_that_is_not_json_ends_the_stream_as_an_in_band_error() -> None:
    tap = StreamTap()
    forwarded, units = tap_pieces([content("hi"), b"data: {not json\n\n", content("after")], tap)
    assert forwarded == content("hi")  # nothing from the unreadable event on
    assert units == 1 and tap.error_kind == "stream_bad_event" and "not JSON" in tap.error["message"]


def test_empty_data_is_no_error() -> None:
    tap = StreamTap()
    forwarded, _ = tap_pieces([b"data: \n\n", b"data: [DONE]\n\n"], tap)
    assert tap.error is None and tap.done and forwarded.endswith(b"data: [DONE]\n\n")
