"""Property tests of the stream relay (hypothesis): any split of a valid upstream stream
into reads forwards the same bytes and derives the same counts, through the SSE tap
and through the whole relay; a stream cut anywhere ends with exactly the complete
events before the cut, one error event and no ``[DONE]``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replay import load_expect, load_stream, split_bytes, stream_fixture_names
from sse_tap import as_forwarded, tap_pieces

from latgate.forwarding.exchange import Exchange
from latgate.forwarding.recorder import Recorder
from latgate.forwarding.relay import StreamRelay
from latgate.forwarding.sse import StreamTap
from latgate.foundation.metrics import Metrics

CLEAN = [name for name in stream_fixture_names() if name != "error_first_event"]
PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@st.composite
def split_stream(draw: st.DrawFn, names: Sequence[str] = CLEAN) -> tuple[str, list[bytes]]:
    """A fixture stream and an arbitrary split of it into reads (1 to 40 cuts anywhere)."""
    name = draw(st.sampled_from(names))
    body = load_stream(name)
    cuts = draw(st.lists(st.integers(min_value=1, max_value=len(body) - 1), max_size=40))
    return name, split_bytes(body, cuts)


@PROPERTY
@given(split_stream(names=stream_fixture_names()))
def test_tap_forwards_the_same_bytes_and_counts_for_any_split(case: tuple[str, list[bytes]]) -> None:
    name, pieces = case
    whole_tap = StreamTap()
    whole, whole_units = tap_pieces([b"".join(pieces)], whole_tap)
    tap = StreamTap()
    forwarded, units = tap_pieces(pieces, tap)
    assert forwarded == whole
    assert units == whole_units == tap.content_chunks == load_expect(name).content_chunks
    assert (tap.usage, tap.done, tap.error) == (whole_tap.usage, whole_tap.done, whole_tap.error)


def sse_events(data: bytes) -> list[bytes]:
    """The events a spec-following SSE parser dispatches (blank-line runs are no-ops)."""
    text = data.replace(b"\r\n", b"\n")
    return [event for event in text.split(b"\n\n") if event.strip(b"\n")]


@PROPERTY
@given(split_stream(), st.booleans())
def test_tap_edits_give_the_same_events_for_any_split(
    case: tuple[str, list[bytes]], drop_usage: bool
) -> None:
    # Bytes may differ in runs of blank lines where an event was dropped (reported to
    # the SSE tap's owner); the events a client sees must not.
    _, pieces = case
    options = {"drop_usage_chunk": drop_usage, "model_rewrite": ("sim-model", "public-name")}
    whole, _ = tap_pieces([b"".join(pieces)], StreamTap(**options))
    forwarded, _ = tap_pieces(pieces, StreamTap(**options))
    assert sse_events(forwarded) == sse_events(whole)


# -- the whole relay, as an ASGI app, with a scripted upstream body -------------------


async def upstream_body(pieces: list[bytes], *, then_fail: bool) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece
        await asyncio.sleep(0)
    if then_fail:
        raise ConnectionResetError("connection reset by peer")  # what the H1 transport raises


async def run_relay(pieces: list[bytes], *, then_fail: bool = False) -> tuple[bytes, Exchange, int, Metrics]:
    metrics = Metrics(providers=["up"], models=["m"])
    exchange = Exchange(
        request_id="r",
        received_at=time.perf_counter(),
        path="/chat/completions",
        stream=True,
        provider="up",
        public_model="m",
    )
    closed = []
    sent: list[bytes] = []
    never = asyncio.Event()

    async def receive() -> dict:
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    async def on_close() -> None:
        closed.append(True)

    relay = StreamRelay(
        headers=[],
        head=b"",
        head_units=0,
        body=upstream_body(pieces, then_fail=then_fail),
        tap=StreamTap(),
        exchange=exchange,
        recorder=Recorder(metrics=metrics),
        on_close=on_close,
        on_upstream_failure=lambda kind: None,
    )
    await relay({"type": "http"}, receive, send)
    return b"".join(sent), exchange, len(closed), metrics


@PROPERTY
@given(split_stream())
def test_relay_forwards_the_same_bytes_and_counts_for_any_split(case: tuple[str, list[bytes]]) -> None:
    name, pieces = case
    forwarded, exchange, closes, _ = asyncio.run(run_relay(pieces))
    expect = load_expect(name)
    whole = as_forwarded(b"".join(pieces))
    assert forwarded == (whole if expect.done else whole + b"data: [DONE]" + (b"\r\n\r\n" if b"\r\n" in whole else b"\n\n"))
    assert exchange.status == 200 and exchange.finished and closes == 1
    if expect.usage:
        assert exchange.completion_tokens == expect.usage["completion_tokens"]
    else:
        assert exchange.completion_tokens == expect.content_chunks


def complete_events(data: bytes) -> bytes:
    """The prefix of ``data`` made of whole events (ending in a blank line)."""
    ends = [data.rfind(sep) + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if data.rfind(sep) >= 0]
    return data[: max(ends)] if ends else b""


CUT_STREAMS = ["vllm_chat", "vllm_chat_crlf", "utf8_multibyte", "tool_calls"]


def check_cut_stream(body: bytes, cut: int, cuts: list[int]) -> None:
    pieces = split_bytes(body[:cut], cuts)
    forwarded, exchange, closes, metrics = asyncio.run(run_relay(pieces, then_fail=True))
    whole = complete_events(body[:cut])
    assert forwarded.startswith(whole)
    tail = forwarded[len(whole) :]
    assert tail.startswith(b"data: ") and tail.endswith(b"\n\n") and tail.count(b"data: ") == 1
    assert orjson.loads(tail[6:])["error"]["code"] == "upstream_error"
    assert b"[DONE]" not in forwarded
    assert exchange.status == 502 and closes == 1
    rendered = metrics.render()[0].decode()
    assert (
        'latgate_in_flight_requests{provider="up"}' not in rendered
        or 'latgate_in_flight_requests{provider="up"} 0.0' in rendered
    )


def event_ends(body: bytes) -> list[int]:
    sep = b"\r\n\r\n" if b"\r\n" in body else b"\n\n"
    ends, at = [], body.find(sep)
    while at >= 0:
        ends.append(at + len(sep))
        at = body.find(sep, at + len(sep))
    return ends


@PROPERTY
@given(st.sampled_from(CUT_STREAMS), st.data())
def test_a_stream_cut_between_events_ends_with_them_one_error_event_and_no_done(
    name: str, data: st.DataObject
) -> None:
    body = load_stream(name)
    ends = [end for end in event_ends(body) if end < body.find(b"data: [DONE]")]
    cut = data.draw(st.sampled_from(ends), label="cut")
    check_cut_stream(
        body,
        cut,
        data.draw(st.lists(st.integers(min_value=1, max_value=cut - 1), max_size=20), label="reads"),
    )


@PROPERTY
@given(st.sampled_from(CUT_STREAMS), st.data())
def test_a_stream_cut_inside_an_event_ends_with_the_whole_events_one_error_event_and_no_done(
    name: str, data: st.DataObject
) -> None:
    body = load_stream(name)
    ends = set(event_ends(body))
    cut = data.draw(
        st.integers(min_value=1, max_value=body.find(b"data: [DONE]") - 1).filter(lambda c: c not in ends),
        label="cut",
    )
    check_cut_stream(
        body,
        cut,
        data.draw(st.lists(st.integers(min_value=1, max_value=max(1, cut - 1)), max_size=20), label="reads"),
    )
