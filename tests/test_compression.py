"""Compressed upstream answers (gzip, deflate, br, zstd) sent whatever latgate's
``Accept-Encoding: identity`` said: decoded for JSON answers and streams alike, never
a 502 nor a mark against the endpoint's health; a malformed or unknown one is the
provider's clear error. Scripted raw upstreams on loopback (tests/h1_upstreams.py).
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import zlib
from collections.abc import Callable

import brotli
import httpx
import openai
import pytest
import zstandard
from completions import DONE, content
from h1_upstreams import (
    CHAT,
    OK_JSON,
    STREAM,
    RawUpstream,
    assert_clean_logs,
    chunk,
    json_reply,
    keep_serving,
    stack_on,
)
from memory_transport import MemoryResponse
from stack import gateway

from latgate.transport.decoding import STEP_BYTES, DecodedResponse
from latgate.transport.errors import UpstreamFailure


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


CODINGS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Callable[[], None]:
    caplog.set_level("DEBUG", logger="latgate")
    return lambda: assert_clean_logs(caplog)


def health(v1: str) -> dict:
    return httpx.get(v1.removesuffix("/v1") + "/admin/providers", timeout=5).json()["providers"]["up"]["endpoints"][0]


@pytest.mark.parametrize("coding", sorted(CODINGS))
def test_a_compressed_json_answer_is_decoded_and_counts_as_a_success(coding: str, logs: Callable[[], None]) -> None:
    reply = json_reply(CODINGS[coding](OK_JSON), extra=b"content-encoding: %s\r\n" % coding.encode())
    with stack_on(keep_serving(reply)) as (up, v1, _app):
        for _ in range(3):
            client = openai.OpenAI(base_url=v1, api_key="k", max_retries=0)
            completion = client.chat.completions.create(model="m", messages=CHAT["messages"])
            assert completion.choices[0].message.content == "ok"
        assert b"accept-encoding: identity" in up.requests[0].lower()
        assert health(v1)["healthy"] and health(v1)["consecutive_failures"] == 0
    logs()


@pytest.mark.parametrize("coding", sorted(CODINGS))
def test_a_compressed_stream_is_decoded_as_it_arrives(coding: str, logs: Callable[[], None]) -> None:
    """Chunked, compressed, each event flushed on its own (``Z_SYNC_FLUSH`` for gzip):
    the client reads every event and the ``[DONE]``."""
    events = [content("one "), content("two "), content("three"), DONE]
    if coding == "gzip":
        packer = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
        pieces = [packer.compress(e) + packer.flush(zlib.Z_SYNC_FLUSH) for e in events] + [packer.flush()]
    else:
        whole = CODINGS[coding](b"".join(events))
        pieces = [whole[: len(whole) // 2], whole[len(whole) // 2 :]]
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"content-encoding: %s\r\n\r\n" % coding.encode()
    )
    reply = head + b"".join(chunk(p) for p in pieces if p) + b"0\r\n\r\n"
    with stack_on(keep_serving(reply)) as (_up, v1, _app):
        with httpx.stream("POST", v1 + "/chat/completions", json=STREAM, timeout=15) as response:
            assert response.status_code == 200 and "content-encoding" not in response.headers
            text = response.read().decode()
        assert text.count("data: ") == 4 and text.rstrip().endswith("data: [DONE]")
        assert '"one "' in text and '"three"' in text
        client = openai.OpenAI(base_url=v1, api_key="k", max_retries=0)
        stream = client.chat.completions.create(model="m", messages=CHAT["messages"], stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "one two three"
        assert health(v1)["consecutive_failures"] == 0
    logs()


def test_a_raw_deflate_body_is_accepted_as_browsers_do(logs: Callable[[], None]) -> None:
    reply = json_reply(raw_deflate(OK_JSON), extra=b"content-encoding: deflate\r\n")
    with stack_on(keep_serving(reply)) as (_up, v1, _app):
        response = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "ok"
    logs()


@pytest.mark.parametrize(
    ("encoding", "body", "message"),
    [
        (b"gzip", b"this is not gzip at all", "compressed body is malformed"),
        (b"gzip", gzip.compress(OK_JSON)[:-12], "compressed body ended early"),
        (b"compress", OK_JSON, "content encoding 'compress', which latgate cannot decode"),
    ],
    ids=["malformed", "truncated", "unknown"],
)
def test_a_bad_compressed_answer_is_a_clear_provider_error(
    encoding: bytes, body: bytes, message: str, logs: Callable[[], None]
) -> None:
    reply = json_reply(body, extra=b"content-encoding: %s\r\n" % encoding)
    with stack_on(keep_serving(reply)) as (_up, v1, _app):
        response = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["message"].startswith("provider 'up' is unavailable") and message in error["message"]
    logs()


#: a bomb: this many zero bytes, compressed (each coding to a few KiB or less), more
#: than latgate's former fixed 64 MiB bound
BOMB_BYTES = 72 * 1024 * 1024
BOMB_LIMIT = 1024 * 1024  # the max_response_bytes the bomb tests configure
BOMB_CODINGS = {
    "gzip": lambda data: gzip.compress(data, 9),
    "br": lambda data: brotli.compress(data, quality=5),
    "zstd": lambda data: zstandard.ZstdCompressor(level=3).compress(data),
}


@functools.cache
def bomb(coding: str) -> bytes:
    return BOMB_CODINGS[coding](bytes(BOMB_BYTES))


async def _bombing(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers model ``bomb-CODING`` (``-stream``: as an event stream) with a bomb in
    one write, any other model with a plain answer."""
    while True:
        request = await up.request(reader)
        model = json.loads(request.partition(b"\r\n\r\n")[2])["model"]
        if not model.startswith("bomb-"):
            writer.write(json_reply())
        else:
            coding, _, stream = model.removeprefix("bomb-").partition("-")
            kind = b"text/event-stream" if stream else b"application/json"
            head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-encoding: %s\r\n" % (kind, coding.encode())
            writer.write(head + b"transfer-encoding: chunked\r\n\r\n" + chunk(bomb(coding)) + b"0\r\n\r\n")
        await writer.drain()


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
@pytest.mark.parametrize("coding", sorted(BOMB_CODINGS))
def test_a_compression_bomb_stops_at_max_response_bytes_and_others_go_on(
    coding: str, stream: bool, logs: Callable[[], None]
) -> None:
    with RawUpstream(_bombing) as up:
        text = (
            f"[defaults]\nmax_retries = 0\nmax_response_bytes = {BOMB_LIMIT}\n"
            f'[providers.up]\napi_base = "{up.base_url}"\n'
        )
        with gateway(text) as gw:

            async def together() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=60) as client:
                    model = f"bomb-{coding}" + ("-stream" if stream else "")
                    bombs = [client.post(gw.v1 + "/chat/completions", json={**CHAT, "model": model, "stream": stream}) for _ in range(3)]
                    return await asyncio.gather(*bombs, client.post(gw.v1 + "/chat/completions", json=CHAT))

            *bombed, plain = asyncio.run(together())
            after = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=15)
    assert plain.status_code == 200 and after.status_code == 200, (plain.text, after.text)
    for response in bombed:
        if stream:  # before any content: an error answer; bounded by the decoded size or by one event's
            assert response.status_code == 502, response.text
        else:
            assert response.status_code == 502, response.text
            error = response.json()["error"]
            assert f"decodes to more than {BOMB_LIMIT} bytes" in error["message"]  # the configured bound
            assert error["code"] == "response_too_large"  # latgate's own bound: not the upstream's failure
    logs()


def _decoded(reads: list[bytes], coding: str) -> DecodedResponse:
    """A body of ``reads`` (one per read) in ``coding``, decoded."""
    inner = MemoryResponse(200, {"content-encoding": coding}, list(reads))
    return DecodedResponse(
        status_code=200, headers=inner.headers, body=inner.aiter_raw(), close=inner.aclose,
        close_connection=inner.close_connection, content_encoding=coding, max_decoded_bytes=BOMB_LIMIT,
    )  # fmt: skip


@pytest.mark.parametrize("coding", sorted(BOMB_CODINGS))
def test_a_bomb_in_one_read_is_decoded_in_bounded_steps_up_to_the_bound(coding: str) -> None:
    """What decoding a bomb costs is bounded: no read of the decoded body is more than
    one step, and it stops one step past the bound (bytes produced, not time)."""
    decoded = _decoded([bomb(coding)], coding)

    async def drain() -> list[int]:
        sizes: list[int] = []
        with pytest.raises(UpstreamFailure) as failed:
            async for piece in decoded:
                sizes.append(len(piece))
        assert failed.value.kind == "too_large"
        return sizes

    sizes = asyncio.run(drain())
    assert max(sizes) <= STEP_BYTES
    assert sum(sizes) <= BOMB_LIMIT
    assert sum(decoder.produced for decoder in decoded._decoders) <= BOMB_LIMIT + STEP_BYTES


def test_a_compressed_error_answer_keeps_its_message() -> None:
    error = b'{"error":{"message":"context too long","type":"invalid_request_error"}}'
    reply = json_reply(gzip.compress(error), status=b"400 Bad Request", extra=b"content-encoding: gzip\r\n")
    with stack_on(keep_serving(reply)) as (_up, v1, _app):
        response = httpx.post(v1 + "/chat/completions", json=CHAT, timeout=15)
    assert response.status_code == 400 and "context too long" in response.json()["error"]["message"]


def test_a_compressed_stream_larger_than_max_event_bytes_in_all_passes_when_its_events_are_small(
    logs: Callable[[], None],
) -> None:
    """``max_event_bytes`` bounds one event (and what is held before the first token),
    not a read: one compressed piece decoding to many small events is relayed whole."""
    events = [content(f"word{i} ") for i in range(400)] + [DONE]
    whole = b"".join(events)
    assert len(whole) > 16 * 1024
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"content-encoding: gzip\r\n\r\n"
    )
    reply = head + chunk(gzip.compress(whole)) + b"0\r\n\r\n"
    with RawUpstream(keep_serving(reply)) as up:
        text = (
            f'[defaults]\nmax_retries = 0\nmax_event_bytes = 16384\n[providers.up]\napi_base = "{up.base_url}"\n'
        )
        with gateway(text) as gw, httpx.stream("POST", gw.v1 + "/chat/completions", json=STREAM, timeout=15) as response:
            body = response.read().decode()
    assert response.status_code == 200
    assert body.count("data: ") == 401 and body.rstrip().endswith("data: [DONE]")
    logs()
