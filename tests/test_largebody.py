"""Large bodies parsed and encoded in slices (latgate.forwarding.largebody): the same values and
bytes as orjson, the same refusals; and a large body proxied end to end."""

from __future__ import annotations

import threading

import httpx
import orjson
import pytest
from h1_upstreams import SECRET, RawUpstream, json_reply, keep_serving
from h1_upstreams import config as upstream_config
from stack import gateway

from latgate.api.body import ClientBody
from latgate.forwarding import largebody
from latgate.forwarding.largebody import (
    LARGE_BODY_BYTES,
    SLICE_ITEMS,
    dumps_in_slices,
    is_large,
    parse_in_slices,
)

BODIES = [
    {"model": "m", "messages": [{"role": "user", "content": f"hi {i} é 😀 \\\" \n"} for i in range(3 * SLICE_ITEMS + 7)]},
    {"messages": [], "stream": None, "n": 1, "t": 0.5, "tools": [{"a": [1, 2, {"b": None}]}], "x": True},
    {},
    {"prompt": ["a"] * (SLICE_ITEMS + 1), "nested": {"deep": [[1], [2, [3]]]}},
]


@pytest.mark.parametrize("body", BODIES, ids=["many-messages", "mixed", "empty", "lists"])
def test_slices_parse_and_encode_as_orjson_does(body) -> None:
    raw = orjson.dumps(body)
    assert parse_in_slices(raw) == orjson.loads(raw)
    assert parse_in_slices(b" \n" + orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n") == body
    assert dumps_in_slices(body) == raw


@pytest.mark.parametrize(
    "raw",
    [b'{"a": NaN}', b'{"a": Infinity}', b'{"a":1,}', b'{"a":[1,2,]}', b'{"a":1} x', b'{"a" 1}', b'{1: 2}', b"", b"\xff{}", b'{"a": [1 2]}'],
)
def test_slices_refuse_what_orjson_refuses(raw: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    with pytest.raises(ValueError):
        parse_in_slices(raw)


@pytest.mark.parametrize("slice_bytes", [4, 5, 7, 64])
def test_a_body_decoded_a_slice_at_a_time_parses_and_refuses_as_one_decode(monkeypatch, slice_bytes) -> None:
    monkeypatch.setattr(largebody, "DECODE_SLICE_BYTES", slice_bytes)
    for body in [*BODIES, {"a": 12345678901, "b": [True, None, -0.5e3], "é😀": "ü" * 9}]:
        raw = orjson.dumps(body)
        assert parse_in_slices(raw) == body
        assert parse_in_slices(b" \n" + orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n") == body
    valid = orjson.dumps({"m": ["é😀" * 40]})
    for cut in range(1, len(valid) - 1):  # a stray byte, and a character cut short, anywhere
        with pytest.raises(UnicodeDecodeError):
            parse_in_slices(valid[:cut] + b"\xff" + valid[cut:])
    for raw in [b'{"a": [1 2]}', b'{"a":[1,2,]}', b'{"a":1} x', b'{"a": 12', b'{"a": "x']:
        with pytest.raises(ValueError):
            parse_in_slices(raw)


def test_a_large_body_that_is_not_utf8_is_refused_with_400_before_the_upstream() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"m {i}"} for i in range(LARGE_BODY_BYTES // 20)]})
    middle = raw.index(b"m 30000")
    raw = raw[:middle] + b"\xc3(" + raw[middle:]  # a two-byte sequence cut short
    with RawUpstream(keep_serving(json_reply())) as up, gateway(upstream_config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        answer = httpx.post(gw.v1 + "/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=60)
        assert answer.status_code == 400
        assert "not valid UTF-8" in answer.json()["error"]["message"]
        assert up.requests == []


def test_only_long_top_level_arrays_are_large() -> None:
    assert is_large({"messages": [{}] * (2 * SLICE_ITEMS + 1)})
    assert not is_large({"messages": [{}] * SLICE_ITEMS, "x": "y" * 10})


def test_a_large_body_is_proxied_unchanged_but_for_the_model() -> None:
    messages = [{"role": "user", "content": f"message {i}"} for i in range(60_000)]
    body = {"model": "m", "messages": messages, "temperature": 0.25}
    assert len(orjson.dumps(body)) > LARGE_BODY_BYTES
    with RawUpstream(keep_serving(json_reply())) as up, gateway(upstream_config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        answer = httpx.post(gw.v1 + "/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200
        sent = orjson.loads(up.requests[0].split(b"\r\n\r\n", 1)[1])
        assert sent == body
        bad = httpx.post(gw.v1 + "/chat/completions", content=orjson.dumps(body)[:-1], timeout=60)
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]


def test_array_elements_share_their_repeated_keys_and_short_values() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"m {i}"} for i in range(3000)]})
    body = parse_in_slices(raw)
    assert body == orjson.loads(raw)
    first, last = body["messages"][0], body["messages"][-1]
    assert [id(k) for k in first] == [id(k) for k in last]  # one "role", one "content"
    assert first["role"] is last["role"]


def test_slicing_offers_the_gil_more_often_and_restores_the_interval() -> None:
    import sys

    from latgate.forwarding.largebody import SLICING_SWITCH_INTERVAL_SECONDS, prompt_switching

    before = sys.getswitchinterval()
    with prompt_switching():
        with prompt_switching():
            assert sys.getswitchinterval() == pytest.approx(SLICING_SWITCH_INTERVAL_SECONDS)
        assert sys.getswitchinterval() == pytest.approx(SLICING_SWITCH_INTERVAL_SECONDS)
    assert sys.getswitchinterval() == pytest.approx(before)



def test_a_proxied_large_body_hands_the_freed_heap_back_once_the_request_ends(monkeypatch) -> None:
    trimmed = threading.Event()
    monkeypatch.setattr(largebody, "_TRIM", lambda pad: trimmed.set())
    body = {"model": "m", "messages": [{"role": "user", "content": f"m {i}"} for i in range(LARGE_BODY_BYTES // 20)]}
    with (
        RawUpstream(keep_serving(json_reply())) as up,
        gateway(upstream_config(up.base_url), env={"UP_KEY": SECRET}) as gw,
    ):
        assert httpx.post(gw.v1 + "/chat/completions", json=body, timeout=30).status_code == 200
        assert trimmed.wait(5), "the large body's memory was never handed back"


def test_a_freed_body_leaves_an_array_still_held_elsewhere_intact_then_trims(monkeypatch) -> None:
    trimmed = threading.Event()
    monkeypatch.setattr(largebody, "_TRIM", lambda pad: trimmed.set())
    messages = [{"role": "user", "content": str(i)} for i in range(3 * SLICE_ITEMS)]
    body = ClientBody({"messages": messages})
    largebody.release_when_freed(body)
    assert not trimmed.is_set()
    del body
    assert trimmed.wait(5)
    assert len(messages) == 3 * SLICE_ITEMS and messages[-1] == {"role": "user", "content": str(3 * SLICE_ITEMS - 1)}
