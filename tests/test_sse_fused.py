"""The SSE tap's fused path (``StreamTap.feed``: a read of one one-line event, framing,
facts and edits inline) gives what the composed path (``StreamTap.feed_framed``:
boundary search, split, each event read and edited) gives, read for read, on any split
of real recorded streams (vLLM 0.32, SGLang, and the hand-made fixtures), under every
edit the tap makes (the usage chunk dropped, the model rewritten, errors in the text)."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from replay import dechunked

from latgate.forwarding.sse import StreamTap
from latgate.transport.errors import UpstreamFailure

FIXTURES = Path(__file__).parent / "fixtures"
MODEL = re.compile(rb'"model": ?"([^"]+)"')


def recorded_streams() -> dict[str, bytes]:
    streams = {p.name: p.read_bytes() for p in sorted((FIXTURES / "streams").glob("*.sse"))}
    streams |= {p.name: p.read_bytes() for p in sorted((FIXTURES / "sglang").glob("*.sse"))}
    streams |= {p.name: dechunked(p.read_bytes()) for p in sorted((FIXTURES / "vllm-0.32-cpu").glob("*.raw"))}
    return streams


STREAMS = recorded_streams()
FACTS = ("content_chunks", "usage", "done", "error", "error_kind", "events", "finish_reason", "responses", "aborted", "finished", "separator")


def reads(body: bytes, rng: random.Random, keep_events: float, cuts: int) -> list[bytes]:
    """``body`` cut after each event with probability ``keep_events`` (an engine flushing
    per token: one-event reads) and at ``cuts`` random offsets."""
    ends = [m.end() for m in re.finditer(rb"\r\n\r\n|\n\n", body)]
    points = {end for end in ends if rng.random() < keep_events}
    points |= {rng.randrange(1, len(body)) for _ in range(cuts) if len(body) > 1}
    edges = [0, *sorted(p for p in points if 0 < p < len(body)), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges) if b > a]


def fed(tap: StreamTap, pieces: list[bytes], *, fused: bool) -> list[object]:
    """Each read's result (or the failure it raised), then the flush and the held events."""
    feed = tap.feed if fused else tap.feed_framed
    results: list[object] = []
    for piece in pieces:
        try:
            results.append(feed(piece))
        except UpstreamFailure as failure:
            results.append(("failed", failure.kind))
            return results
    results.append(tap.flush())
    results.append(tap.release_held())
    return results


def tap_for(body: bytes, *, drop_usage: bool, rewrite: bool, text_error: bool, max_event_bytes: int | None) -> StreamTap:
    served = MODEL.search(body)
    return StreamTap(
        drop_usage_chunk=drop_usage,
        model_rewrite=(served.group(1).decode(), "alias") if rewrite and served else None,
        max_event_bytes=max_event_bytes,
        text_error=b"[decode error: " if text_error else None,
        secrets=(b"sk-secret",),
    )


class CountingTap(StreamTap):
    """A tap that counts the reads taking the composed path."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.framed = 0

    def feed_framed(self, data: bytes) -> tuple[bytes, int]:
        self.framed += 1
        return super().feed_framed(data)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(sorted(STREAMS)),
    seed=st.integers(0, 2**32 - 1),
    keep_events=st.sampled_from([1.0, 0.9, 0.5, 0.0]),
    cuts=st.integers(0, 12),
    drop_usage=st.booleans(),
    rewrite=st.booleans(),
    text_error=st.booleans(),
    max_event_bytes=st.sampled_from([None, None, 400]),
)
def test_the_fused_path_forwards_counts_and_edits_as_the_composed_one(
    name: str, seed: int, keep_events: float, cuts: int, drop_usage: bool, rewrite: bool, text_error: bool, max_event_bytes: int | None
) -> None:
    body = STREAMS[name]
    pieces = reads(body, random.Random(seed), keep_events, cuts)
    options = {"drop_usage": drop_usage, "rewrite": rewrite, "text_error": text_error, "max_event_bytes": max_event_bytes}
    fused, composed = tap_for(body, **options), tap_for(body, **options)
    assert fed(fused, pieces, fused=True) == fed(composed, pieces, fused=False)
    assert {fact: getattr(fused, fact) for fact in FACTS} == {fact: getattr(composed, fact) for fact in FACTS}


def test_reads_of_one_event_each_take_the_fused_path() -> None:
    # the property above compares something: an engine's per-token reads skip the framing
    body = STREAMS["chat_stream_usage.raw"]
    pieces = reads(body, random.Random(0), 1.0, 0)
    tap = CountingTap(drop_usage_chunk=True, model_rewrite=("tiny", "alias"))
    for piece in pieces:
        tap.feed(piece)
    assert len(pieces) > 10 and tap.framed == 1  # the first read: the stream's separator is not known yet
