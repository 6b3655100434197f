"""A body orjson parses but cannot encode again (nested past its depth limit) reaches the
upstream as the client's own bytes: unchanged when latgate changes nothing, with only
the changed members spliced in when it does (an alias's upstream model,
``stream_options.include_usage`` on a stream, a null ``stream``, a provider's
``extra_body``). Every other body is encoded from its parse (tests/test_duplicate_keys.py).
Through a real gateway and a raw upstream on loopback."""

from __future__ import annotations

import json

import httpx
import orjson
import pytest
from completions import DONE, content
from h1_upstreams import OK_JSON, SECRET, SSE_HEAD, RawUpstream, chunk, json_reply, keep_serving
from stack import gateway

from latgate.proxy.splice import ClientBody, splice

SSE_REPLY = SSE_HEAD + chunk(content("ok")) + chunk(DONE) + b"0\r\n\r\n"


def _config(base: str, extra: str = "") -> str:
    return (
        "[defaults]\ntimeout_sec = 10\nconnect_timeout_sec = 2\nmax_retries = 0\n"
        f'[providers.up]\napi_base = "{base}"\napi_key_env = "UP_KEY"\n{extra}'
    )


def _forwarded(raw: bytes, *, extra: str = "", reply: bytes = json_reply(OK_JSON), stream: bool = False) -> bytes:
    """The body the upstream received for a client POST of ``raw``."""
    with (
        RawUpstream(keep_serving(reply)) as up,
        gateway(_config(up.base_url, extra), env={"UP_KEY": SECRET}) as gw,
    ):
        response = httpx.post(
            gw.v1 + "/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=10
        )
        assert response.status_code == 200, response.text
        if stream:
            assert "ok" in response.text
        up.wait_until(lambda: len(up.requests) == 1)
        return up.requests[0].split(b"\r\n\r\n", 1)[1]


#: nested past orjson's encoding depth (~254): such a body is forwarded as its bytes
DEEP = b"[" * 300 + b"]" * 300
# the client's own spelling: spaces, escapes, a non-ASCII text, members in its order
PLAIN = (
    b'{ "messages" : [ {"role":"user", "content":"say \\"model\\": \\u4e2d\\u6587 \xc3\xa9", "meta": ' + DEEP + b"} ],\n"
    b'  "temperature": 0.50, "model": "m" }'
)


def test_an_unchanged_body_reaches_the_upstream_byte_for_byte() -> None:
    assert _forwarded(PLAIN) == PLAIN


def test_an_agent_sized_body_reaches_the_upstream_byte_for_byte() -> None:
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "Runs a step. " * 20,
                                          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
        for i in range(25)
    ]  # fmt: skip
    history = [{"role": "user", "content": f"step {i}: " + "def f(x):\n    return x\n" * 150} for i in range(25)]
    raw = json.dumps({"model": "m", "messages": history, "tools": tools}, ensure_ascii=True).encode()
    raw = raw.replace(b'{"role": "user"', b'{"meta": ' + DEEP + b', "role": "user"', 1)
    assert len(raw) > 90_000
    assert _forwarded(raw) == raw


def test_an_alias_rewrites_only_the_model_value() -> None:
    raw = PLAIN.replace(b'"m"', b'"public"')
    sent = _forwarded(raw, extra='[aliases]\n"public" = "org/served-7b"\n')
    assert sent == raw.replace(b'"public"', b'"org/served-7b"')


def test_a_stream_gets_include_usage_and_nothing_else_changes() -> None:
    raw = PLAIN.replace(b'"temperature"', b'"stream": true, "temperature"')
    sent = _forwarded(raw, reply=SSE_REPLY, stream=True)
    assert sent == b'{"stream_options":{"include_usage":true},' + raw[1:]


def test_a_streams_own_options_keep_their_fields_and_gain_include_usage() -> None:
    raw = PLAIN.replace(b'"temperature"', b'"stream": true, "stream_options": {"continuous_usage_stats": true}, "temperature"')
    sent = _forwarded(raw, reply=SSE_REPLY, stream=True)
    assert orjson.loads(sent)["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    assert sent.startswith(PLAIN[: PLAIN.index(b'"temperature"')])  # the messages exactly as the client wrote them


def test_a_null_stream_is_sent_as_false_in_place() -> None:
    raw = PLAIN.replace(b'"temperature"', b'"stream": null, "temperature"')
    assert _forwarded(raw) == raw.replace(b'"stream": null', b'"stream": false')


def test_extra_body_fields_are_inserted_and_the_clients_bytes_follow() -> None:
    sent = _forwarded(PLAIN, extra="extra_body = { top_k = 20 }\n")
    assert sent == b'{"top_k":20,' + PLAIN[1:]


def test_a_model_key_also_nested_in_a_tool_schema_is_rewritten_only_at_the_top() -> None:
    body = {
        "model": "public",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "pick", "parameters": {
            "type": "object", "properties": {"model": {"type": "string"}}}}}],
    }  # fmt: skip
    sent = _forwarded(json.dumps(body).encode(), extra='[aliases]\n"public" = "org/served-7b"\n')
    assert orjson.loads(sent) == {**body, "model": "org/served-7b"}


# -- splice on plain data ---------------------------------------------------------------


def _client(raw: bytes) -> ClientBody:
    return ClientBody(orjson.loads(raw), raw)


def test_nothing_changed_is_the_clients_own_bytes_object() -> None:
    body = _client(PLAIN)
    assert splice(body, dict(body)) is PLAIN


def test_a_removed_member_takes_one_separating_comma_with_it() -> None:
    for raw in (b'{"a":1, "stream_options": {"x": "}"} ,"b":2}', b'{"a":1,"b":2 , "stream_options":{}}'):
        body = _client(raw)
        out = {k: v for k, v in body.items() if k != "stream_options"}
        assert orjson.loads(splice(body, out)) == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"a","messages":[],"model":"b"}',  # a duplicated key
        b'{"mod\\u0065l":"a","messages":[{"model":"a"}]}',  # the top-level key spelled with an escape
        b'{"model":"a","messages":[{"model":"a"}]}',  # the same name nested
    ],
)
def test_a_member_that_cannot_be_located_unambiguously_is_left_to_a_full_encode(raw: bytes) -> None:
    body = _client(raw)
    assert splice(body, {**body, "model": "z"}) is None


def test_a_quote_inside_a_string_is_not_mistaken_for_a_key() -> None:
    raw = b'{"messages":[{"content":"\\"model\\": \\\\\\"x"}],"model":"a"}'
    body = _client(raw)
    assert orjson.loads(splice(body, {**body, "model": "z"})) == {**body, "model": "z"}
