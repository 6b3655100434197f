"""Upstream-authored error text reaches a client only redacted: no internal address
(IP, ``host:port``, URL), no key (the provider's own or anything that looks like one)
and no stack trace, while the upstream's words around them stay. On chat completions
and ``/v1/messages`` alike, for an error status, a relayed 400 and an error event
before the first token of a stream. Through a real gateway and a raw upstream on
loopback."""

from __future__ import annotations

import httpx
import orjson
import pytest
from h1_upstreams import CHAT, SSE_HEAD, STREAM, chunk, json_reply, keep_serving, stack_on

from latgate.forwarding.redact import redact_text

LEAKS = ("10.1.2.3", "8000", "ABCDEFGHIJKLMNOPQRSTUV1234", "Traceback", "db.internal", "most recent call")
MESSAGE = (
    "boom at 10.1.2.3:8000 (db.internal:5432, http://10.1.2.3:8000/v1?key=x) key sk-proj-ABCDEFGHIJKLMNOPQRSTUV1234 "
    'Traceback (most recent call last):\n  File "/srv/app.py", line 12, in handler'
)
MESSAGES_BODY = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _error(kind: str = "server_error") -> bytes:
    return orjson.dumps({"error": {"message": MESSAGE, "type": kind}})


def _assert_redacted(text: str) -> None:
    assert "boom at" in text, text
    for leak in LEAKS:
        assert leak not in text, (leak, text)


@pytest.mark.parametrize(
    "reply",
    [json_reply(_error(), status=b"500 Internal"), json_reply(_error("invalid_request_error"), status=b"400 Bad")],
    ids=["500", "400"],
)
@pytest.mark.parametrize(
    ("api", "body", "envelope"),
    [("/chat/completions", CHAT, "error"), ("/messages", MESSAGES_BODY, "error")],
    ids=["openai", "anthropic"],
)
def test_an_error_status_shows_the_upstreams_words_without_addresses_keys_or_traces(reply, api, body, envelope) -> None:
    with stack_on(keep_serving(reply)) as (_, v1, _app):
        answer = httpx.post(v1 + api, json=body, timeout=10)
    assert answer.status_code in (400, 500, 502), answer.text
    assert envelope in answer.json()
    if api == "/messages":
        assert answer.json()["type"] == "error"
    _assert_redacted(answer.text)


@pytest.mark.parametrize(
    ("api", "body"), [("/chat/completions", STREAM), ("/messages", {**MESSAGES_BODY, "stream": True})], ids=["openai", "anthropic"]
)
def test_an_error_event_before_the_first_token_is_redacted_too(api, body) -> None:
    reply = SSE_HEAD + chunk(b"data: " + _error() + b"\n\n") + b"0\r\n\r\n"
    with stack_on(keep_serving(reply)) as (_, v1, _app):
        answer = httpx.post(v1 + api, json=body, timeout=10)
    assert answer.status_code != 200 or "error" in answer.text, answer.text
    _assert_redacted(answer.text)


def test_redacted_text_keeps_ordinary_words_and_numbers() -> None:
    text = "context length 8192 exceeded: 9000 tokens (model Meta-Llama-3-8B-Instruct, file.py line 3)"
    assert redact_text(text) == text


def test_an_escaped_backslash_beside_the_key_is_read_as_one() -> None:
    """JSON's ``\\\\`` (a Windows path in an upstream's message) is one backslash, not an error."""
    key = b"sk-abcdefgh12345678"
    assert redact_text(r"path C:\\dir, key sk-abcdefgh12345678", (key,)) == r"path C:\\dir, key <redacted>"
