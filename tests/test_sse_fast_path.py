"""The SSE tap's cheap paths (one-event reads, chunks counted from their bytes against
the stream's last parsed chunk) give the same counts, edits and facts as parsing every
event; and the batched inter-token histogram ends equal to one ``observe`` per sample."""

from __future__ import annotations

import json
import logging
import random

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from latgate.forwarding import sse_facts
from latgate.forwarding.sse import StreamTap
from latgate.foundation.logs import TEXT_FORMAT, TextLineFormatter
from latgate.foundation.metrics import BATCH_SAMPLES, ITL_BUCKETS_SECONDS, Metrics

TEXTS = [None, "", "x", " token", 'say "hi"', "ends in \\", "\\", "é", "中文", "\n", "content", '"delta":{']


def reference_units(chunk: dict) -> int:
    """Content units of one parsed chat chunk, as the tap's docstring defines them."""
    units = 0
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            fields = ("content", "reasoning_content", "tool_calls", "reasoning")
            units += any(delta.get(key) for key in fields)
        elif choice.get("text"):
            units += 1
    return units


def encode(chunk: dict, *, spaced: bool) -> bytes:
    if spaced:  # Python's json module: ", " and ": " separators, non-ASCII escaped
        return json.dumps(chunk).encode()
    return orjson.dumps(chunk)


@st.composite
def chunks(draw: st.DrawFn) -> dict:
    """A chat chunk: 0 to 3 choices whose deltas carry any mix of text fields."""
    choices = []
    for index in range(draw(st.integers(min_value=0, max_value=3))):
        delta = {}
        for key in draw(
            st.lists(
                st.sampled_from(["content", "reasoning_content", "reasoning", "role"]),
                max_size=3,
                unique=True,
            )
        ):
            delta[key] = draw(st.sampled_from(TEXTS)) if key != "role" else "assistant"
        if draw(st.booleans()):
            delta["tool_calls"] = draw(
                st.sampled_from([None, [], [{"index": 0, "function": {"arguments": '{"a": 1}'}}]])
            )
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        if draw(st.booleans()):
            choice["logprobs"] = {
                "content": draw(st.sampled_from([None, [], [{"token": "x", "logprob": -0.1}]]))
            }
        choices.append(choice)
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices,
    }
    extra = draw(st.sampled_from(["none", "usage_null", "usage", "pad"]))
    if extra == "usage_null":
        chunk["usage"] = None
    elif extra == "usage":
        chunk["usage"] = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    elif extra == "pad":  # a field that differs on every chunk (as OpenAI's "obfuscation")
        chunk["obfuscation"] = draw(st.text(alphabet="abcXYZ019", max_size=8))
    return chunk


def template_chunk(text: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}],
    }


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(chunks(), min_size=1, max_size=12), st.booleans(), st.booleans())
def test_every_chunk_counts_as_a_json_parse_counts_it(
    stream: list[dict], spaced: bool, drop_usage: bool
) -> None:
    # A plain content chunk first and between the others, so the tap has a template
    # to try every drawn chunk against.
    tap = StreamTap(drop_usage_chunk=drop_usage)
    for chunk in [c for drawn in stream for c in (template_chunk("warm"), drawn)]:
        event = b"data: " + encode(chunk, spaced=spaced) + b"\n\n"
        forwarded, units = tap.feed(event)
        assert units == reference_units(chunk)
        dropped = drop_usage and not chunk["choices"] and bool(chunk.get("usage"))
        stripped = drop_usage and chunk["choices"] and bool(chunk.get("usage"))  # usage the client did not ask for
        without_usage = b"data: " + orjson.dumps({k: v for k, v in chunk.items() if k != "usage"}) + b"\n\n"
        assert forwarded == (b"" if dropped else without_usage if stripped else event)
    assert tap.content_chunks == sum(reference_units(c) for c in stream) + len(stream)


def test_chunks_differing_only_in_their_text_are_counted_and_forwarded_unchanged() -> None:
    tap = StreamTap()
    texts = [" token", "a\\nb", "\\u00e9t\\u00e9", "x" * 5000, "\\\\"]
    events = [b"data: " + orjson.dumps(template_chunk("first")) + b"\n\n"]
    prefix, _, suffix = events[0].partition(b"first")
    events += [prefix + text.encode() + suffix for text in texts]
    assert all(orjson.loads(event[6:]) for event in events)  # each one valid JSON
    results = [tap.feed(event) for event in events]
    assert results == [(event, 1) for event in events]
    assert tap.content_chunks == len(events) and tap.events == len(events)


def test_a_chunk_matching_the_template_frame_but_not_a_string_is_parsed() -> None:
    tap = StreamTap()
    first = b"data: " + orjson.dumps(template_chunk("first")) + b"\n\n"
    prefix, _, suffix = first.partition(b"first")
    tap.feed(first)
    # an empty text, and "text" whose quote ends the string early (the content is
    # empty, another field follows): parsed, not matched
    assert tap.feed(prefix + suffix)[1] == 0
    assert tap.feed(prefix + b'","role":"x' + suffix)[1] == 0
    assert tap.feed(prefix + rb"x\\" + suffix)[1] == 1  # an escaped backslash: parsed, still content
    assert tap.content_chunks == 2


def test_usage_and_error_events_after_content_are_still_seen() -> None:
    tap = StreamTap(drop_usage_chunk=True)
    stream = [template_chunk("a"), template_chunk("b")]
    for chunk in stream:
        tap.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")
    usage = {**template_chunk("c"), "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    assert tap.feed(b"data: " + orjson.dumps(usage) + b"\n\n") == (b"", 0)
    assert tap.usage == {"prompt_tokens": 1, "completion_tokens": 2}
    assert tap.feed(b"data: [DONE]\n\n") == (b"data: [DONE]\n\n", 0)
    assert tap.done and tap.content_chunks == 2


def test_model_rewrite_applies_to_one_event_reads_and_to_batches_alike() -> None:
    events = [b"data: " + orjson.dumps(template_chunk(text)) + b"\n\n" for text in ("a", "b", "c")]
    one_by_one = StreamTap(model_rewrite=("m", "alias"))
    batched = StreamTap(model_rewrite=("m", "alias"))
    forwarded = b"".join(one_by_one.feed(event)[0] for event in events)
    assert (
        forwarded
        == batched.feed(b"".join(events))[0]
        == b"".join(events).replace(b'"model":"m"', b'"model":"alias"')
    )


def test_batched_itl_samples_give_the_same_histogram_as_one_observe_each() -> None:
    single, batched = Metrics(providers=["p"], models=["m"]), Metrics(providers=["p"], models=["m"])
    observe = single.itl_observer(provider="p", model="m")
    batch = batched.itl_batch(provider="p", model="m")
    rng = random.Random(3)
    samples = [rng.choice(ITL_BUCKETS_SECONDS) for _ in range(150)] + [rng.random() / 10 for _ in range(150)]
    samples += [0.0, 10_000.0]
    for seconds in samples:
        observe(seconds)
        batch.observe(seconds)
    batch.flush()
    batch.flush()  # idempotent

    def itl_series(metrics: Metrics) -> dict[str, float]:
        lines = generate_latest(metrics.registry).decode().splitlines()
        series = [
            line.rsplit(" ", 1) for line in lines if line.startswith("latgate_inter_token_latency_seconds_")
        ]
        return {name: float(value) for name, value in series}

    expect, got = itl_series(single), itl_series(batched)
    assert expect.keys() == got.keys()
    for name in expect:
        if name.endswith('_sum{model="m",provider="p"}'):
            assert abs(expect[name] - got[name]) < 1e-6
        else:
            assert expect[name] == got[name], name


def test_batched_itl_samples_reach_the_histogram_every_batch_before_the_flush() -> None:
    metrics = Metrics(providers=["p"], models=["m"])
    batch = metrics.itl_batch(provider="p", model="m")
    for _ in range(BATCH_SAMPLES + 1):
        batch.observe(0.001)
    text = generate_latest(metrics.registry).decode()
    assert (
        f'latgate_inter_token_latency_seconds_count{{model="m",provider="p"}} {float(BATCH_SAMPLES)}' in text
    )


def test_text_log_lines_read_as_the_standard_formatter_writes_them() -> None:
    standard, cached = logging.Formatter(TEXT_FORMAT), TextLineFormatter(TEXT_FORMAT)
    for created in (1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.5004, 1_700_000_001.0):
        record = logging.LogRecord("latgate.access", logging.INFO, __file__, 1, '{"a":1}', None, None)
        record.created, record.msecs = created, int((created - int(created)) * 1000)
        assert cached.format(record) == standard.format(record)


def test_chunks_differing_only_in_their_text_are_not_parsed_again(monkeypatch) -> None:
    parsed: list[bytes] = []

    class CountingJson:
        JSONDecodeError = orjson.JSONDecodeError

        @staticmethod
        def loads(data: bytes) -> object:
            parsed.append(data)
            return orjson.loads(data)

    monkeypatch.setattr(sse_facts, "orjson", CountingJson)  # where chunks are parsed
    tap = StreamTap()
    role = {**template_chunk(""), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    events = [role] + [template_chunk(f"token {i}") for i in range(20)]
    units = [tap.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")[1] for chunk in events]
    assert units == [0] + [1] * 20
    assert len(parsed) == 2  # the role chunk and the first content chunk
