"""Base URLs as hosted providers publish them, and upstream redirects: each form
reaches the path the issue names (seen by a raw upstream on loopback), a same-origin
307/308 is followed once with its method and body, and any other redirect is a clear
error that never sends the provider's key to another host.
"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import openai
import pytest
from h1_upstreams import CHAT, OK_JSON, SECRET, RawUpstream, config, json_reply, keep_serving
from stack import gateway

from latgate.commands.check import report_lines
from latgate.foundation.config import load_config_text

FORMS = [
    ("/api", "/api/v1/chat/completions"),  # https://taotoken.net/api (the acceptance configs' curl)
    ("", "/v1/chat/completions"),  # http://h:8000
    ("/v1", "/v1/chat/completions"),
    ("/v1/", "/v1/chat/completions"),
    ("/v1beta/openai/", "/v1beta/openai/chat/completions"),  # Gemini
    ("/api/paas/v4", "/api/paas/v4/chat/completions"),  # Zhipu
    ("/compatible-mode/v1", "/compatible-mode/v1/chat/completions"),  # DashScope
    ("/openai/v1", "/openai/v1/chat/completions"),  # Groq
]


def request_path(request: bytes) -> str:
    return request.split(b" ", 2)[1].decode()


@pytest.mark.parametrize(("path", "called"), FORMS, ids=[p or "origin" for p, _ in FORMS])
def test_each_base_url_form_reaches_the_path_its_provider_serves(path: str, called: str) -> None:
    with RawUpstream(keep_serving(json_reply())) as up:
        base = f"http://127.0.0.1:{up.port}{path}"
        with gateway(config(base), env={"UP_KEY": SECRET}) as gw:
            response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
            check = "\n".join(report_lines(gw.config, warnings=[]))
    assert response.status_code == 200, response.text
    assert request_path(up.requests[0]) == called
    assert f"calls http://127.0.0.1:{up.port}{called}" in check


def test_api_base_exact_uses_the_url_as_given() -> None:
    with RawUpstream(keep_serving(json_reply())) as up:
        base = f"http://127.0.0.1:{up.port}/serving/openai-compatible"
        with gateway(config(base, extra="api_base_exact = true\n"), env={"UP_KEY": SECRET}) as gw:
            assert httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15).status_code == 200
    assert request_path(up.requests[0]) == "/serving/openai-compatible/chat/completions"


def test_api_base_exact_must_be_a_boolean() -> None:
    with pytest.raises(Exception, match="api_base_exact"):
        load_config_text(config("http://127.0.0.1:9", extra='api_base_exact = "yes"\n'), source="t.toml", env={})


def redirecting(status: bytes, location: bytes):
    """First request: a redirect to ``location``; later ones: the JSON answer."""

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await up.request(reader)
            if len(up.requests) == 1:
                writer.write(b"HTTP/1.1 %s\r\nlocation: %s\r\ncontent-length: 0\r\n\r\n" % (status, location))
            else:
                writer.write(json_reply())
            await writer.drain()

    return handler


@pytest.mark.parametrize("status", [b"307 Temporary Redirect", b"308 Permanent Redirect"])
@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_a_same_origin_307_or_308_is_followed_once_with_method_and_body(status: bytes, absolute: bool) -> None:
    holder: dict[str, int] = {}

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        where = b"/moved/v1/chat/completions"
        if absolute:
            where = b"http://127.0.0.1:%d%s" % (holder["port"], where)
        await redirecting(status, where)(up, reader, writer)

    with RawUpstream(handler) as up:
        holder["port"] = up.port
        with gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
            response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
    assert response.status_code == 200 and response.content == OK_JSON
    assert [request_path(r) for r in up.requests] == ["/v1/chat/completions", "/moved/v1/chat/completions"]
    first, second = up.requests
    assert second.startswith(b"POST ") and second.split(b"\r\n\r\n", 1)[1] == first.split(b"\r\n\r\n", 1)[1]
    assert json.loads(second.split(b"\r\n\r\n", 1)[1])["messages"] == CHAT["messages"]
    assert f"authorization: Bearer {SECRET}".encode() in second


def test_a_second_redirect_is_not_followed() -> None:
    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await up.request(reader)
            writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /again\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()

    with RawUpstream(handler) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
    message = response.json()["error"]["message"]  # /again redirects to itself
    assert response.status_code == 502 and "redirect loop (HTTP 307 to /again, after a redirect to /again)" in message
    assert len(up.requests) == 2


def closing_redirects(*locations: bytes):
    """The n-th request (one per connection) gets a 307 to ``locations[n]`` (then the
    JSON answer), and the connection is closed after it, as many redirectors do."""

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        if len(up.requests) > len(locations):
            writer.write(json_reply())
        else:
            location = locations[len(up.requests) - 1]
            writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: %s\r\ncontent-length: 0\r\n\r\n" % location)
        await writer.drain()
        writer.close()

    return handler


def test_a_redirect_is_followed_on_a_new_connection_when_the_redirector_closes_its_own() -> None:
    with (
        RawUpstream(closing_redirects(b"/moved/v1/chat/completions")) as up,
        gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw,
    ):
        client = openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0, timeout=15)
        completion = client.chat.completions.create(model="m", messages=CHAT["messages"])
    assert completion.choices[0].message.content == "ok"
    assert [request_path(r) for r in up.requests] == ["/v1/chat/completions", "/moved/v1/chat/completions"]
    assert up.total == 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_redirect_back_to_the_path_it_came_from_is_a_redirect_loop(stream: bool, caplog: pytest.LogCaptureFixture) -> None:
    """``/v1/chat/completions`` -> 307 ``/moved`` (followed once) -> 307 back: a loop,
    named as one (it was "upstream closed the connection: connection reset", the
    second request having gone out on the connection the redirector had closed)."""
    caplog.set_level(logging.INFO, logger="latgate.access")
    with (
        RawUpstream(closing_redirects(b"/moved", b"/v1/chat/completions")) as up,
        gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw,
    ):
        client = openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0, timeout=15)
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="m", messages=CHAT["messages"], stream=stream)
    assert caught.value.status_code == 502
    message = caught.value.body["message"]
    assert "redirect loop (HTTP 307 to /v1/chat/completions, after a redirect to /moved)" in message, message
    assert str(up.port) not in message and "127.0.0.1" not in message
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access"]
    assert line["status"] == 502 and line["cause"] == "redirect loop: HTTP 307 to /v1/chat/completions"
    assert len(up.requests) == 2


def test_a_second_redirect_elsewhere_is_named_a_second_redirect(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    with (
        RawUpstream(closing_redirects(b"/moved", b"/moved-again")) as up,
        gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw,
    ):
        response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert "a second redirect (HTTP 307 to /moved-again, after one to /moved)" in message, message
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access"]
    assert line["cause"] == "second redirect: HTTP 307 to /moved-again"
    assert len(up.requests) == 2


@pytest.mark.parametrize("status", [b"307 Temporary Redirect", b"308 Permanent Redirect"])
@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_a_redirect_to_its_own_path_is_a_refused_loop_named_by_path(
    status: bytes, absolute: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """An upstream that answers a 307/308 naming the URL it was sent to, then closes
    the connection as many redirectors do: a redirect loop, not followed, with the
    Location's path (never its host) in the client's error and the access line."""

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.request(reader)
        where = b"/v1/chat/completions"
        if absolute:
            where = b"http://127.0.0.1:%d%s" % (up.port, where)
        writer.write(b"HTTP/1.1 %s\r\nlocation: %s\r\ncontent-length: 0\r\n\r\n" % (status, where))
        await writer.drain()
        writer.close()

    caplog.set_level(logging.INFO, logger="latgate.access")
    with RawUpstream(handler) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
        port = up.port
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert f"redirect loop (HTTP {status[:3].decode()} to /v1/chat/completions" in message, message
    assert str(port) not in message and "127.0.0.1" not in message
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access"]
    assert line["status"] == 502 and line["cause"] == f"redirect loop: HTTP {status[:3].decode()} to /v1/chat/completions"
    assert len(up.requests) == 1


def test_a_refused_cross_origin_redirect_names_its_path_in_the_log_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    with RawUpstream(keep_serving(json_reply())) as other:
        elsewhere = b"https://127.0.0.1:%d/openai/v1/chat/completions?k=1" % other.port
        with RawUpstream(redirecting(b"302 Found", elsewhere)) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
            response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
    message = response.json()["error"]["message"]
    assert response.status_code == 502 and "redirect to another origin (HTTP 302)" in message, message
    assert str(other.port) not in message and "k=1" not in message and "/openai" not in message
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "latgate.access"]
    assert line["cause"].startswith("redirect refused: HTTP 302 to /openai/v1/chat/completions, another origin")


@pytest.mark.parametrize("status", [b"307 Temporary Redirect", b"308 Permanent Redirect", b"302 Found", b"301 Moved"])
def test_a_redirect_to_another_host_is_a_clear_error_and_the_key_stays_home(status: bytes) -> None:
    with RawUpstream(keep_serving(json_reply())) as other:
        elsewhere = b"http://127.0.0.1:%d/v1/chat/completions" % other.port
        with RawUpstream(redirecting(status, elsewhere)) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
            response = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
        assert other.requests == []
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert f"HTTP {status[:3].decode()}" in message and "does not follow" in message and "another origin" in message
    assert str(other.port) not in message and SECRET not in response.text
