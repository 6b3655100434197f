"""An upstream that echoes latgate's key transformed (upper-cased, a 16-character run
from inside it, its last 12 characters, HTML character references, zero-width or
space-separated characters, fullwidth forms) in an error's message, or in the
``error.code`` / ``type`` that becomes the access log's and ``/ui``'s ``error`` field,
shows none of it to a client, a log line or ``/ui``; that field is bounded and free of
control characters. Through a real gateway and a raw upstream on loopback; the client
is the openai SDK."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import unicodedata

import httpx
import openai
import pytest
from h1_upstreams import RawUpstream, access_lines, config, json_reply
from stack import gateway

from latgate.forwarding.redact import MAX_UPSTREAM_LABEL_CHARS, MIN_KEY_RUN_CHARS

KEY = "sk-proj-Zx81Qm2Lp0Rt7Vb3Hn5KqW9e"
ZERO_WIDTH = "\u200b"


def fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


#: how each mode's upstream writes the key it was sent
TRANSFORMS = {
    "upper": lambda key: key.upper(),
    "inner16": lambda key: key[6:22],
    "last12": lambda key: key[-12:],
    "entities": lambda key: "".join(f"&#{ord(c)};" for c in key),
    "hex-entities": lambda key: "".join(f"&#x{ord(c):x};" for c in key),
    "zero-width": lambda key: ZERO_WIDTH.join(key),
    "spaced": lambda key: " ".join(key),
    "fullwidth": fullwidth,
}


def _reply(mode: str, key: str) -> bytes:
    place, _, transform = mode.partition(":")
    echo = TRANSFORMS[transform](key)
    if place == "message":
        error = {"message": f"Incorrect API key provided: {echo}.", "type": "server_error", "code": "bad_key"}
    else:  # the code: any string an upstream likes, control characters and 64 KiB of it
        error = {"message": "no", "type": "server_error", "code": f"bad key {echo}\x1b[31m\r\n" + "x" * 60000}
    return json_reply(json.dumps({"error": error}).encode(), status=b"500 Internal Server Error")


async def _echo(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        request = await up.request(reader)
        head, _, body = request.partition(b"\r\n\r\n")
        auth = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"authorization:"))
        writer.write(_reply(json.loads(body)["model"], auth.split(b" ", 2)[-1].decode()))
        await writer.drain()


def _as_read(text: str) -> str:
    """``text`` as a person reads it: references decoded, NFKC, no zero-width or white
    space, lower case (independent of latgate's own reading)."""
    text = unicodedata.normalize("NFKC", html.unescape(text)).replace(ZERO_WIDTH, "")
    return "".join(text.split()).lower()


def _assert_no_key(text: str) -> None:
    read = _as_read(text)
    for start in range(len(KEY) - MIN_KEY_RUN_CHARS + 1):
        assert KEY[start : start + MIN_KEY_RUN_CHARS].lower() not in read, text


@pytest.mark.parametrize("place", ["message", "code"])
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_a_transformed_key_in_an_upstream_error_reaches_no_client_log_or_ui(
    place: str, transform: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with RawUpstream(_echo) as up, gateway(config(up.base_url), env={"UP_KEY": KEY}) as gw:
        client = openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as raised:
            client.chat.completions.create(model=f"{place}:{transform}", messages=[{"role": "user", "content": "hi"}])
        ui = httpx.get(gw.url + "/ui/state").json()
    body = raised.value.response.text
    _assert_no_key(body)
    if place == "message":
        assert "Incorrect API key provided" in body  # the upstream's own words stay
    for line in [r.getMessage() for r in caplog.records if r.name.startswith(("latgate", "uvicorn"))]:
        _assert_no_key(line)
    (access,) = [line for line in access_lines(caplog) if line["path"] == "/v1/chat/completions"]
    (shown,) = [request for request in ui["requests"] if request["path"] == "/v1/chat/completions"]
    for error in (access["error"], shown["error"]):
        _assert_no_key(error)
        assert len(error) <= MAX_UPSTREAM_LABEL_CHARS, error
        assert error.isprintable(), error
