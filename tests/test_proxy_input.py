"""Hostile or malformed client input gets a 4xx envelope, never a 500, and is never echoed
unsanitised: each test states the behaviour guaranteed."""

from __future__ import annotations

import socket

import httpx
import pytest
from replay import ReplayScript, load_stream, replay_server
from stack import gateway

M = [{"role": "user", "content": "hi"}]


# --- 500s from client input ---------------------------------------------------------------


@pytest.mark.parametrize("options", [5, "abc", True, [[1, 2]]], ids=["int", "str", "bool", "pairs"])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_non_object_stream_options_is_a_400_not_a_500(path: str, options: object) -> None:
    """forward._payload does dict(out.get("stream_options") or {}) -> TypeError/ValueError."""
    body = {"model": "m", "stream": True, "stream_options": options}
    body.update({"messages": M} if path == "/chat/completions" else {"prompt": "hi"})
    with replay_server(ReplayScript.sse(load_stream("vllm_chat"))) as up, gateway(f'[providers.up]\napi_base = "{up.base_url}"\n') as gw:
        r = httpx.post(gw.v1 + path, json=body, timeout=10)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "stream_options"


def _nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def test_deeply_nested_tools_that_parse_are_a_400_not_a_500() -> None:
    """orjson.loads accepts depth <= 1024 but orjson.dumps stops at ~254: the body is
    parsed, then the tools token estimate (which encodes them) cannot run."""
    raw = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[' + _nested(300) + b"]}"
    with replay_server(ReplayScript.json_response(200, {"ok": 1})) as up, gateway(f'[providers.up]\napi_base = "{up.base_url}"\n') as gw:
        r = httpx.post(gw.v1 + "/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=10)
        assert r.status_code == 400, r.text


def test_404_does_not_echo_a_request_id_with_control_characters() -> None:
    """Gateway.handle replaces a non-printable X-Request-Id; the 404/405 handler echoes it raw."""
    with replay_server(ReplayScript.json_response(200, {"ok": 1})) as up, gateway(f'[providers.up]\napi_base = "{up.base_url}"\n') as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET /nope HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\x01b\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head = data.split(b"\r\n\r\n", 1)[0]
        assert b"404" in head.split(b"\r\n", 1)[0]
        assert b"a\x01b" not in head


def test_count_tokens_with_tools_nested_deep_is_not_a_500() -> None:
    raw = b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"tools":[' + _nested(300) + b"]}"
    with replay_server(ReplayScript.json_response(200, {"ok": 1})) as up, gateway(f'[providers.up]\napi_base = "{up.base_url}"\n') as gw:
        r = httpx.post(gw.url + "/v1/messages/count_tokens", content=raw, headers={"content-type": "application/json"}, timeout=10)
        assert r.status_code < 500, r.text
        assert "input_tokens" in r.json() or r.json()["type"] == "error"
