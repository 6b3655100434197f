"""A ``data:`` line that is not JSON in a chat or completions stream ends the stream as
the upstream's failure, as it does on the translated routes: after output began, with
the relay's own error event (``data: {"error": ...}``, no ``[DONE]``, nothing of the
upstream's after it), which the openai SDK raises as ``APIError``; before it, a 502.
Either is counted against the provider (``latgate_upstream_errors_total``) and logged
as a failure. Through a real gateway and a raw upstream on loopback."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import openai
import pytest
from completions import DONE, chat_chunk, content, event
from h1_upstreams import SSE_HEAD, RawUpstream, access_errors, chunk, config
from processes import poll
from stack import gateway

BROKEN = b"data: {not json, upstream debug\n\n"
FINISH = event(chat_chunk({}, finish_reason="stop")) + DONE


def _text_chunk(text: str) -> bytes:
    return event({"id": "c", "object": "text_completion", "model": "m", "choices": [{"index": 0, "text": text, "finish_reason": None}]})


async def _broken(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A stream whose model says when the unreadable event comes: ``first`` (before
    any content) or ``mid`` (once the client has read ``partial``)."""
    while True:
        request = await up.request(reader)
        head, _, body = request.partition(b"\r\n\r\n")
        completions = b" /v1/completions " in head.split(b"\r\n", 1)[0]
        first, after = (_text_chunk("partial"), _text_chunk("after")) if completions else (content("partial"), content("after"))
        if json.loads(body)["model"] == "first":
            writer.write(SSE_HEAD + chunk(BROKEN + first + FINISH) + b"0\r\n\r\n")
        else:
            writer.write(SSE_HEAD + chunk(first))
            await writer.drain()
            await up.released.wait()
            writer.write(chunk(BROKEN + after + FINISH) + b"0\r\n\r\n")
        await writer.drain()


def _bad_event_errors(v1: str) -> float:
    text = httpx.get(v1.removesuffix("/v1") + "/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("latgate_upstream_errors_total{") and 'kind="stream_bad_event"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"], ids=["chat", "completions"])
def test_data_that_is_not_json_after_content_ends_the_stream_with_an_error_event(path: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    body = {"model": "mid", "stream": True, **({"prompt": "hi"} if path == "/completions" else {"messages": [{"role": "user", "content": "hi"}]})}
    with RawUpstream(_broken) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        raw = b""
        with httpx.stream("POST", gw.v1 + path, json=body, timeout=15) as answer:
            for piece in answer.iter_raw():
                raw += piece
                if b"partial" in raw:
                    up.release()
        assert answer.status_code == 200
        text = raw.decode()
        last = text.rstrip("\n").rsplit("\n\n", 1)[-1]
        error = json.loads(last.removeprefix("data: "))["error"]
        assert "not JSON" in error["message"] and error["type"] == "api_error", text
        assert "[DONE]" not in text and "after" not in text and "not json" not in text and "debug" not in text, text
        assert poll(lambda: _bad_event_errors(gw.v1), timeout=10, what="the upstream error counted") == 1
        assert poll(lambda: access_errors(caplog), timeout=10, what="the access line") == [(502, "stream_bad_event")]


def test_the_openai_sdk_raises_api_error_on_it() -> None:
    with RawUpstream(_broken) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        client = openai.OpenAI(base_url=gw.v1, api_key="x", max_retries=0)
        seen = []
        with pytest.raises(openai.APIError, match="not JSON"):
            for part in client.chat.completions.create(model="mid", messages=[{"role": "user", "content": "hi"}], stream=True):
                seen.append(part.choices[0].delta.content)
                up.release()
        assert seen == ["partial"]


def test_data_that_is_not_json_before_content_is_the_providers_failure(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with RawUpstream(_broken) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        client = openai.OpenAI(base_url=gw.v1, api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError, match="not JSON"):
            list(client.chat.completions.create(model="first", messages=[{"role": "user", "content": "hi"}], stream=True))
        assert poll(lambda: _bad_event_errors(gw.v1), timeout=10, what="the upstream error counted") == 1
        assert poll(lambda: access_errors(caplog), timeout=10, what="the access line")[0][0] == 502
