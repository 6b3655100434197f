"""The replay upstream itself: framing on the wire, end behaviours, recording, fixtures."""

from __future__ import annotations

import dataclasses
import json
import re
import socket

import httpx
import pytest
from replay import (
    STREAMS_DIR,
    ReplayScript,
    load_expect,
    load_stream,
    replay_server,
    split_bytes,
    split_points,
    stream_fixture_names,
)

TIMEOUT = httpx.Timeout(5.0)
REQUIRED_FIXTURES = {
    "vllm_chat",
    "vllm_chat_crlf",
    "data_no_space",
    "keepalive_comments",
    "event_and_id_fields",
    "utf8_multibyte",
    "no_done",
    "error_first_event",
    "reasoning",
    "tool_calls",
    "n2_interleaved",
    "sglang_usage_in_last_chunk",
}


def read_raw(url: str, *, client: httpx.Client | None = None) -> tuple[httpx.Response, bytes]:
    owned = client or httpx.Client(timeout=TIMEOUT)
    try:
        with owned.stream("POST", url, json={"stream": True}) as response:
            return response, b"".join(response.iter_raw())
    finally:
        if client is None:
            owned.close()


def raw_exchange(origin: str, request: bytes) -> bytes:
    """Send ``request`` on a fresh socket and read until the server closes it."""
    host, port = origin.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(request)
        received = bytearray()
        while data := sock.recv(65536):
            received += data
    return bytes(received)


@pytest.mark.parametrize("framing", ["chunked", "content-length", "close"])
def test_sse_body_arrives_byte_exact_under_each_framing(framing):
    body = load_stream("utf8_multibyte")
    script = ReplayScript.sse(body, split_at=split_points(body, "utf8"), framing=framing, pause_ms=0.5)
    with replay_server(script) as server:
        response, received = read_raw(server.base_url + "/chat/completions")
    assert received == body
    assert response.headers["content-type"] == "text/event-stream"
    expected_framing_header = {
        "chunked": ("transfer-encoding", "chunked"),
        "content-length": ("content-length", str(len(body))),
        "close": ("connection", "close"),
    }[framing]
    assert response.headers[expected_framing_header[0]] == expected_framing_header[1]


def test_each_piece_is_its_own_http_chunk_on_the_wire():
    script = ReplayScript(headers=[("content-type", "text/event-stream")], body_pieces=[b"data: a\n", b"\n"])
    with replay_server(script) as server:
        wire = raw_exchange(server.origin, b"GET /v1/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert wire == (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        b"8\r\ndata: a\n\r\n1\r\n\n\r\n0\r\n\r\n"
    )


def test_drop_mid_chunked_body_gives_client_an_incomplete_body_error():
    body = load_stream("vllm_chat")
    pieces = split_bytes(body, split_points(body, "events"))[:3]
    script = ReplayScript(body_pieces=pieces, end="drop")
    received = bytearray()
    with (
        replay_server(script) as server,
        httpx.Client(timeout=TIMEOUT) as client,
        client.stream("POST", server.base_url + "/chat/completions", json={}) as response,
        pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"),
    ):
        for data in response.iter_raw():
            received += data
    assert bytes(received) == b"".join(pieces)
    assert not server.client_closed.is_set()


def test_drop_short_of_content_length_gives_client_an_incomplete_body_error():
    script = ReplayScript(body_pieces=[b"data: {}\n\n"], framing="content-length", end="drop")
    with (
        replay_server(script) as server,
        httpx.Client(timeout=TIMEOUT) as client,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        client.post(server.base_url + "/chat/completions", json={})


def test_reset_gives_client_a_read_error():
    script = ReplayScript(body_pieces=[b"data: {}\n\n"], end="reset")
    with (
        replay_server(script) as server,
        httpx.Client(timeout=TIMEOUT) as client,
        pytest.raises(httpx.ReadError),
    ):
        client.post(server.base_url + "/chat/completions", json={})


def test_client_closing_a_stalled_stream_sets_client_closed():
    body = load_stream("vllm_chat")
    first_event = split_bytes(body, split_points(body, "events"))[0]
    script = ReplayScript(body_pieces=[first_event], end="stall")
    with replay_server(script) as server, httpx.Client(timeout=TIMEOUT) as client:
        with client.stream("POST", server.base_url + "/chat/completions", json={}) as response:
            chunks = response.iter_raw()  # held: a dropped iterator closes the connection
            assert next(chunks) == first_event
            assert not server.client_closed.is_set()
        assert server.client_closed.wait(timeout=5)


def test_client_closing_before_any_header_sets_client_closed_and_gets_nothing():
    with replay_server(ReplayScript(stall_before_headers=True)) as server:
        host, port = server.origin.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}")
            sock.shutdown(socket.SHUT_WR)
            assert server.client_closed.wait(timeout=5)
            assert sock.recv(65536) == b""
        assert server.requests[0].body == b"{}"


def test_release_ends_a_stall_and_the_body_completes():
    body = load_stream("vllm_chat")
    pieces = split_bytes(body, split_points(body, "events"))
    script = ReplayScript(body_pieces=pieces, end="stall")
    with (
        replay_server(script) as server,
        httpx.Client(timeout=TIMEOUT) as client,
        client.stream("POST", server.base_url + "/chat/completions", json={}) as response,
    ):
        received = bytearray()
        chunks = response.iter_raw()
        while len(received) < len(body):
            received += next(chunks)
        server.release.set()
        received += b"".join(chunks)
    assert bytes(received) == body
    assert not server.client_closed.is_set()


def test_release_before_headers_lets_the_response_through():
    script = dataclasses.replace(ReplayScript.json_response(200, {"ok": True}), stall_before_headers=True)
    with replay_server(script) as server, httpx.Client(timeout=TIMEOUT) as client:
        server.release.set()
        assert client.post(server.base_url + "/chat/completions", json={}).json() == {"ok": True}


def test_scripted_sequence_serves_responses_in_order_then_reports_exhaustion():
    body = load_stream("vllm_chat")
    unavailable = ReplayScript.json_response(
        503, {"error": {"message": "busy", "type": "api_error", "code": None}}, headers=[("retry-after", "0")]
    )
    with (
        replay_server([unavailable, ReplayScript.sse(body)]) as server,
        httpx.Client(timeout=TIMEOUT) as client,
    ):
        first = client.post(server.base_url + "/chat/completions", json={"n": 1})
        second = client.post(server.base_url + "/chat/completions", json={"n": 2})
        third = client.post(server.base_url + "/chat/completions", json={"n": 3})
    assert (first.status_code, first.headers["retry-after"]) == (503, "0")
    assert first.json()["error"]["message"] == "busy"
    assert (second.status_code, second.content) == (200, body)
    assert third.status_code == 500 and "exhausted" in third.json()["error"]["message"]
    assert [r.json()["n"] for r in server.requests] == [1, 2, 3]


def test_requests_are_recorded_with_headers_in_order_and_exact_body():
    with (
        replay_server(ReplayScript.json_response(200, {})) as server,
        httpx.Client(timeout=TIMEOUT) as client,
    ):
        client.post(
            server.base_url + "/chat/completions?trace=1",
            content=b'{"model":"m"}',
            headers={"Authorization": "Bearer k1", "X-Request-Id": "abc", "Content-Type": "application/json"},
        )
        client.post(server.base_url + "/completions", content=iter([b"par", b"ts"]))
    first, second = server.requests
    assert (first.method, first.path, first.body) == (
        "POST",
        "/v1/chat/completions?trace=1",
        b'{"model":"m"}',
    )
    assert first.header("authorization") == "Bearer k1"
    assert ("X-Request-Id", "abc") in first.headers
    names = [name.lower() for name, _ in first.headers]
    assert names.index("authorization") < names.index("x-request-id")
    assert first.json() == {"model": "m"}
    assert second.header("transfer-encoding") == "chunked"
    assert second.body == b"parts"


def test_keep_alive_serves_several_requests_on_one_connection():
    with replay_server(ReplayScript.sse(load_stream("no_done"))) as server:
        with httpx.Client(timeout=TIMEOUT) as client:
            for _ in range(3):
                assert read_raw(server.base_url + "/chat/completions", client=client)[1] == load_stream(
                    "no_done"
                )
        with httpx.Client(timeout=TIMEOUT) as client:
            read_raw(server.base_url + "/chat/completions", client=client)
    assert [r.connection_index for r in server.requests] == [0, 0, 0, 1]
    assert server.connection_count == 2
    assert not server.client_closed.is_set()


def test_script_rejects_an_empty_chunk_and_framing_headers():
    with pytest.raises(ValueError, match="terminating chunk"):
        ReplayScript(body_pieces=[b"a", b""])
    with pytest.raises(ValueError, match="framing headers"):
        ReplayScript(headers=[("Content-Length", "3")])


def test_split_points_cut_where_asked():
    text = "data: 你好🚀\r\n\r\ndata: x\n\n".encode()
    assert split_points(text, "bytes") == list(range(1, len(text)))
    assert [text[p - 1 : p + 1] for p in split_points(text, "crlf")] == [b"\r\n", b"\r\n"]
    utf8 = split_points(text, "utf8")
    assert len(utf8) == 2 + 2 + 3  # two 3-byte CJK characters, one 4-byte emoji
    for piece in split_bytes(text, utf8)[1:]:
        assert piece[0] & 0xC0 == 0x80
    assert split_bytes(text, split_points(text, "events")) == [
        "data: 你好🚀\r\n\r\n".encode(),
        b"data: x\n\n",
    ]
    assert split_points(text, "random", seed=7) == split_points(text, "random", seed=7)
    assert split_points(text, "random", seed=1, count=5) != split_points(text, "random", seed=2, count=5)
    assert b"".join(split_bytes(text, split_points(text, "random", count=9))) == text


def test_every_required_fixture_exists():
    assert REQUIRED_FIXTURES <= set(stream_fixture_names())


def parse_sse(data: bytes) -> list[dict[str, str]]:
    """Events per the WHATWG SSE parsing rules; an unterminated last event is dropped."""
    events, current, data_lines = [], {}, []
    for line in re.split(r"\r\n|\r|\n", data.decode("utf-8"))[:-1]:
        if not line:
            if data_lines:
                events.append({**current, "data": "\n".join(data_lines)})
            current, data_lines = {}, []
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data_lines.append(value)
            elif name in ("event", "id"):
                current[name] = value
    return events


def derive_facts(events: list[dict[str, str]]) -> dict[str, object]:
    facts = {
        "content_chunks": 0,
        "text": "",
        "reasoning_text": "",
        "text_by_choice": {},
        "tool_calls": {},
        "finish_reasons": {},
        "usage": None,
        "done": events[-1]["data"] == "[DONE]",
        "error": None,
    }
    for event in events:
        if event["data"] == "[DONE]":
            continue
        chunk = json.loads(event["data"])
        facts["error"] = chunk.get("error", facts["error"])
        if chunk.get("usage"):
            facts["usage"] = {k: chunk["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
        bearing = False
        for choice in chunk.get("choices", []):
            delta, index = choice["delta"], str(choice["index"])
            bearing |= bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
            facts["text"] += delta.get("content") or ""
            facts["reasoning_text"] += delta.get("reasoning_content") or ""
            if delta.get("content"):
                facts["text_by_choice"][index] = facts["text_by_choice"].get(index, "") + delta["content"]
            for call in delta.get("tool_calls") or []:
                slot = facts["tool_calls"].setdefault(
                    call["index"], {"index": call["index"], "id": None, "name": "", "arguments": ""}
                )
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += call["function"].get("name") or ""
                slot["arguments"] += call["function"].get("arguments") or ""
            if choice.get("finish_reason"):
                facts["finish_reasons"][index] = choice["finish_reason"]
        facts["content_chunks"] += bearing
    facts["tool_calls"] = [facts["tool_calls"][k] for k in sorted(facts["tool_calls"])]
    return facts


@pytest.mark.parametrize("name", stream_fixture_names())
def test_fixture_facts_match_an_independent_sse_parse(name):
    raw = json.loads((STREAMS_DIR / f"{name}.expect.json").read_text("utf-8"))
    assert derive_facts(parse_sse(load_stream(name))) == raw
    expect = load_expect(name)
    assert (expect.done, expect.usage, expect.text) == (raw["done"], raw["usage"], raw["text"])
    assert all(isinstance(index, int) for index in [*expect.finish_reasons, *expect.text_by_choice])


def test_line_ending_fixtures_are_what_their_names_say():
    crlf = load_stream("vllm_chat_crlf")
    assert crlf.count(b"\n") == crlf.count(b"\r\n") > 0
    assert crlf.replace(b"\r\n", b"\n") == load_stream("vllm_chat")
    assert b"data: " not in load_stream("data_no_space")
