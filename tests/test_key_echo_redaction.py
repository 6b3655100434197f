"""An upstream that echoes latgate's own key back (in an error status's body, an
error event before or after the first token) never shows it to a client or a log
line, whatever form the echo takes: with ``/`` written ``\\/`` (PHP's
``json_encode``, Java encoders), every character ``\\uXXXX``-escaped, cut to a
prefix (``Incorrect API key provided: AbCdEf/GhIjK...``). On every API the upstream's
answer reaches (chat completions, ``/v1/messages``, ``/v1/responses``), through a
real gateway and a raw upstream on loopback; a one-character key does not blank out
the letter everywhere."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from apis import BODIES
from completions import content, decoded_answer
from h1_upstreams import SSE_HEAD, RawUpstream, chunk, config, json_reply
from stack import gateway

from latgate.forwarding.redact import MIN_KEY_RUN_CHARS

#: a base64-style key: ``/`` and ``+`` in it, as Azure and self-hosted gateways issue
KEY = "AbCdEf/GhIjKl+MnOpQr1234=="


def slash_escaped(text: str) -> str:
    return text.replace("/", "\\/")


def all_escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


#: how each mode's upstream writes the echoed key into its JSON
ECHOES = {
    "slash": lambda key: slash_escaped(key),
    "unicode": lambda key: all_escaped(key),
    "prefix": lambda key: slash_escaped(key[:12]) + "...",
    "plain": lambda key: key,
}


def _reply(mode: str, key: str) -> bytes:
    """The upstream's answer for ``mode`` (``KIND-ECHO``), echoing ``key``."""
    kind, _, echo = mode.partition("-")
    shown = ECHOES[echo](key) if echo in ECHOES else key
    def written(value: object) -> bytes:  # JSON with the echo put in as the upstream wrote it
        return json.dumps(value).replace("@KEY@", shown).encode()

    error = written({"error": {"message": "bad key @KEY@ here", "type": "invalid_request_error", "param": "@KEY@", "code": "k @KEY@"}})
    if kind == "e400":
        return json_reply(error, status=b"400 Bad Request")
    if kind == "e422":
        detail = written({"detail": [{"msg": "bad key @KEY@ here", "input": {"api_key": "@KEY@"}}]})
        return json_reply(detail, status=b"422 Unprocessable Entity")
    if kind == "e429":
        return json_reply(written({"error": {"message": "bad key @KEY@ here"}}), status=b"429 Too Many Requests")
    if kind == "first":  # an error event as a stream's first event
        return SSE_HEAD + chunk(b"data: " + error + b"\n\n") + b"0\r\n\r\n"
    if kind == "mid":  # an error event after output began (written once the client has "partial")
        return chunk(b"data: " + error + b"\n\n") + b"0\r\n\r\n"
    if kind == "midbad":  # the same, with a byte that is not UTF-8 in it (read as U+FFFD)
        return chunk(b"data: " + error.replace(b"here", b"here \xff") + b"\n\n") + b"0\r\n\r\n"
    raise AssertionError(mode)


async def _echo(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request as its ``model`` says, with the key of its Authorization."""
    while True:
        request = await up.request(reader)
        head, _, body = request.partition(b"\r\n\r\n")
        auth = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"authorization:"))
        key = auth.split(b" ", 2)[-1].decode()
        mode = json.loads(body)["model"]
        if mode.startswith("mid"):  # mid, midbad
            writer.write(SSE_HEAD + chunk(content("partial")))
            await writer.drain()
            await up.released.wait()
        writer.write(_reply(mode, key))
        await writer.drain()


def _assert_no_key(text: str, key: str = KEY) -> None:
    decoded = decoded_answer(text)
    assert key[:MIN_KEY_RUN_CHARS] not in decoded, decoded
    assert slash_escaped(key[:MIN_KEY_RUN_CHARS]) not in decoded, decoded
    assert "bad key" in decoded, decoded  # the upstream's own words stay


def _assert_clean_logs(caplog: pytest.LogCaptureFixture) -> None:
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(("latgate", "uvicorn"))]
    assert any(r.name == "latgate.access" for r in caplog.records)
    for line in lines:
        assert KEY[:MIN_KEY_RUN_CHARS] not in line and slash_escaped(KEY[:MIN_KEY_RUN_CHARS]) not in line, line


def _post(v1: str, api: str, mode: str, *, stream: bool) -> httpx.Response:
    body = {**BODIES[api], "model": mode}
    if stream:
        body["stream"] = True
    return httpx.post(v1 + api, json=body, timeout=15)


def _stream_past_first_content(up: RawUpstream, v1: str, api: str, mode: str) -> tuple[int, str]:
    """(status, whole body) of a stream whose upstream goes on only once the client
    has read the first content (``partial``)."""
    text = ""
    with httpx.stream("POST", v1 + api, json={**BODIES[api], "model": mode, "stream": True}, timeout=15) as answer:
        for piece in answer.iter_text():
            text += piece
            if "partial" in text:
                up.release()
    return answer.status_code, text


ROUTES = ["/chat/completions", "/messages", "/responses"]


@pytest.mark.parametrize("api", ROUTES, ids=["chat", "messages", "responses"])
@pytest.mark.parametrize("mode", ["e400-slash", "e400-unicode", "e400-prefix", "e422-slash", "e429-slash", "e400-plain"])
def test_an_echoed_key_in_an_error_status_never_reaches_the_client(
    api: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with RawUpstream(_echo) as up, gateway(config(up.base_url), env={"UP_KEY": KEY}) as gw:
        answer = _post(gw.v1, api, mode, stream=False)
    assert answer.status_code in (400, 422, 429), answer.text
    _assert_no_key(answer.text)
    _assert_clean_logs(caplog)


@pytest.mark.parametrize("api", ROUTES, ids=["chat", "messages", "responses"])
@pytest.mark.parametrize("mode", ["first-slash", "first-unicode", "mid-slash", "mid-prefix", "midbad-plain"])
def test_an_echoed_key_in_a_streams_error_event_never_reaches_the_client(
    api: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with RawUpstream(_echo) as up, gateway(config(up.base_url), env={"UP_KEY": KEY}) as gw:
        if mode.startswith("mid"):
            status, text = _stream_past_first_content(up, gw.v1, api, mode)
            assert status == 200 and "partial" in text and "error" in text, text
        else:
            text = _post(gw.v1, api, mode, stream=True).text
    _assert_no_key(text)
    _assert_clean_logs(caplog)


def test_a_one_character_key_is_redacted_only_where_it_stands_alone() -> None:
    with RawUpstream(_echo) as up, gateway(config(up.base_url), env={"UP_KEY": "k"}) as gw:
        answer = _post(gw.v1, "/chat/completions", "e400-plain", stream=False)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "bad key <redacted> here"
