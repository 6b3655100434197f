"""A stream's ``stream_options`` per request: a client's ill-typed member is its own
400 (never sent upstream), and what one client writes there never turns usage off
for the others. A provider is withheld the field only on evidence (its refusal of
latgate's own ``{"include_usage": true}`` that the stream without the field gets
past), and only for a while. Through a vLLM-like strict upstream on loopback and the
openai SDK; the withholding policy on plain data."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from completions import DONE, ROLE, chat_chunk, content, event, usage
from h1_upstreams import SSE_HEAD, RawUpstream, chunk, config, json_reply
from stack import gateway

from latgate.live.providers.stream_options import (
    FIRST_WITHHOLD_SECONDS,
    MAX_WITHHOLD_SECONDS,
    StreamOptionsSupport,
)

HI = [{"role": "user", "content": "hi"}]
#: the members of ``stream_options`` the strict upstream knows (vLLM's StreamOptions)
KNOWN = {"include_usage", "continuous_usage_stats"}


def _refusal(member: str, kind: str) -> bytes:
    """vLLM's (pydantic's) 400 for a bad ``stream_options`` member."""
    message = f"[{{'type': '{kind}', 'loc': ('body', 'stream_options', '{member}'), 'msg': 'bad'}}]"
    body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    return json_reply(json.dumps(body).encode(), status=b"400 Bad Request")


def strict(*, refuse_all: bool = False):
    """A vLLM-like upstream: refuses unknown or ill-typed ``stream_options`` members
    (or, ``refuse_all``, the field itself) and sends usage when asked."""

    async def handler(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = json.loads((await up.request(reader)).partition(b"\r\n\r\n")[2])
            options = body.get("stream_options")
            refusal = None
            if options is not None:
                unknown = sorted(set(options) - KNOWN)
                if refuse_all:
                    refusal = _refusal("include_usage", "extra_forbidden")
                elif unknown:
                    refusal = _refusal(unknown[0], "extra_forbidden")
                elif not isinstance(options.get("include_usage", False), bool):
                    refusal = _refusal("include_usage", "bool_parsing")
            if refusal is not None:
                writer.write(refusal)
            else:
                events = ROLE + content("ok") + event(chat_chunk({}, finish_reason="stop"))
                if options and options.get("include_usage"):
                    events += event(chat_chunk(None, usage=usage(1111, 2222)))
                writer.write(SSE_HEAD + chunk(events + DONE) + b"0\r\n\r\n")
            await writer.drain()

    return handler


def _sent_options(up: RawUpstream) -> list[object]:
    """The ``stream_options`` of each request the upstream got (None: absent)."""
    return [json.loads(r.partition(b"\r\n\r\n")[2]).get("stream_options") for r in up.requests]


def _usage_of(client: openai.OpenAI) -> object:
    chunks = list(client.chat.completions.create(model="m", messages=HI, stream=True, stream_options={"include_usage": True}))
    return next((c.usage for c in chunks if c.usage is not None), None)


@pytest.mark.parametrize("value", ["maybe", 1, {"a": 1}], ids=["str", "int", "object"])
@pytest.mark.parametrize("member", ["include_usage", "continuous_usage_stats"])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_an_ill_typed_stream_options_member_is_the_clients_400_and_never_sent(path: str, member: str, value: object) -> None:
    body = {"model": "m", "stream": True, "stream_options": {member: value}}
    body.update({"messages": HI} if path == "/chat/completions" else {"prompt": "hi"})
    with RawUpstream(strict()) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        answer = httpx.post(gw.v1 + path, json=body, timeout=10)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == f"stream_options.{member}"
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert up.requests == []


@pytest.mark.parametrize(
    "poison",
    [{"include_usage": "maybe"}, {"include_usage": True, "bogus": 1}, {"bogus": True}],
    ids=["ill-typed", "unknown-member", "only-unknown"],
)
def test_one_clients_stream_options_never_turn_usage_off_for_the_others(poison: dict) -> None:
    with RawUpstream(strict()) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        client = openai.OpenAI(base_url=gw.v1, api_key="x", max_retries=0)
        assert _usage_of(client).prompt_tokens == 1111
        poisoned = httpx.post(
            gw.v1 + "/chat/completions", json={"model": "m", "messages": HI, "stream": True, "stream_options": poison}, timeout=10
        )
        assert poisoned.status_code in (200, 400), poisoned.text  # its own answer, whichever it is
        for _ in range(3):  # every later client still gets the upstream's own usage
            assert _usage_of(client).prompt_tokens == 1111
        plain = list(client.chat.completions.create(model="m", messages=HI, stream=True))
        assert all(c.usage is None for c in plain)  # latgate asked for usage and kept it from the client
    assert _sent_options(up)[-1] == {"include_usage": True}


def test_a_provider_refusing_latgates_own_stream_options_is_sent_none_until_the_withholding_ends() -> None:
    with RawUpstream(strict(refuse_all=True)) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        client = openai.OpenAI(base_url=gw.v1, api_key="x", max_retries=0)
        first = list(client.chat.completions.create(model="m", messages=HI, stream=True))
        second = list(client.chat.completions.create(model="m", messages=HI, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in first + second if c.choices) == "okok"
        assert _sent_options(up) == [{"include_usage": True}, None, None]  # asked again without, then withheld
        support = gw.app.state.gateway.pool["up"].stream_options
        assert support.refusals == 1 and support.withheld_until > 0
        # the one retry (with max_retries = 0: the field was refused, not the request), counted as one
        assert 'latgate_retries_total{provider="up"} 1.0' in httpx.get(gw.url + "/metrics", timeout=10).text


def test_a_refusal_the_stream_without_the_field_gets_too_teaches_nothing() -> None:
    refused = _refusal("include_usage", "extra_forbidden")

    async def always_400(up: RawUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await up.request(reader)
            writer.write(refused)
            await writer.drain()

    with RawUpstream(always_400) as up, gateway(config(up.base_url), env={"UP_KEY": "k" * 20}) as gw:
        for _ in range(2):
            answer = httpx.post(gw.v1 + "/chat/completions", json={"model": "m", "messages": HI, "stream": True}, timeout=10)
            assert answer.status_code == 400
    assert _sent_options(up) == [{"include_usage": True}, None, {"include_usage": True}, None]


def test_withholding_starts_short_doubles_per_refusal_in_a_row_and_ends() -> None:
    support = StreamOptionsSupport()
    assert not support.withheld(0.0)
    assert support.refused(100.0) == FIRST_WITHHOLD_SECONDS
    assert support.withheld(100.0 + FIRST_WITHHOLD_SECONDS - 1) and not support.withheld(100.0 + FIRST_WITHHOLD_SECONDS)
    assert support.refused(200.0) == 2 * FIRST_WITHHOLD_SECONDS
    for _ in range(40):
        seconds = support.refused(300.0)
    assert seconds == MAX_WITHHOLD_SECONDS
    support.accepted()
    assert not support.withheld(300.0) and support.refused(400.0) == FIRST_WITHHOLD_SECONDS
