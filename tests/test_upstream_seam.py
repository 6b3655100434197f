"""The one upstream interface: :class:`UpstreamClient` is the same code over any
:class:`UpstreamTransport` (here one answering from memory; latgate's own pool in the
loopback tests), and what it adds (a same-origin redirect followed, a compressed answer
decoded, the small GETs, a closed client refusing) applies over it; every foreign
exception a transport raises becomes one :class:`UpstreamFailure` kind whose message
names neither URL nor key."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket

import openai
import pytest
from completions import DONE, ROLE, chat_chunk, chat_completion, content, event
from memory_transport import MemoryResponse, MemoryTransport, Sent
from servers import serve_app

from latgate.app.asgi import create_app
from latgate.foundation.config import load_config_text
from latgate.transport.egress import Egress, Proxy
from latgate.transport.upstream import UpstreamClient, UpstreamFailure

BASE = "http://up.test:9/v1"
KEY = "sk-secret-123"


def _client(transport: MemoryTransport) -> UpstreamClient:
    return UpstreamClient(connect_timeout_seconds=1, read_timeout_seconds=1, transport=transport)


async def _post(client: UpstreamClient, path: str = "/chat/completions") -> tuple[int, bytes]:
    response = await client.open(url=BASE + path, payload=b'{"model":"m"}', headers={"authorization": f"Bearer {KEY}"})
    try:
        return response.status_code, b"".join([chunk async for chunk in response.aiter_raw()])
    finally:
        await response.aclose()


def test_a_compressed_answer_reaches_the_forwarder_decoded_and_closes_the_transports_response() -> None:
    packed = gzip.compress(b'{"ok":1}')
    transport = MemoryTransport(lambda sent: MemoryResponse(200, {"content-encoding": "gzip"}, [packed[:7], packed[7:]]))
    assert asyncio.run(_post(_client(transport))) == (200, b'{"ok":1}')
    assert transport.answered[0].ended == "kept"


def test_a_same_origin_307_is_followed_once_with_its_body_and_another_origin_is_not() -> None:
    def answer(sent: Sent) -> MemoryResponse:
        if sent.url.endswith("/chat/completions"):
            return MemoryResponse(307, {"location": "/v1/moved"})
        if sent.url.endswith("/away"):
            return MemoryResponse(307, {"location": "http://elsewhere.test/v1/moved"})
        return MemoryResponse(200, {"content-type": "application/json"}, [b'{"ok":1}'])

    transport = MemoryTransport(answer)
    client = _client(transport)
    assert asyncio.run(_post(client)) == (200, b'{"ok":1}')
    moved = transport.sent[1]
    assert (moved.url, moved.payload) == (BASE + "/moved", b'{"model":"m"}')
    assert moved.headers["authorization"] == f"Bearer {KEY}"
    assert transport.answered[0].ended == "closed"  # the redirect's connection is not reused
    assert asyncio.run(_post(client, "/away"))[0] == 307
    assert [sent.url for sent in transport.sent[2:]] == [BASE + "/away"]


def test_gets_go_through_the_same_transport_with_the_providers_egress() -> None:
    transport = MemoryTransport(lambda sent: MemoryResponse(200, {"content-type": "application/json"}, [b'{"data":', b"[]}"]))
    proxy = Proxy.parse("http://127.0.0.1:9")  # nothing listens there: only the transport answers
    egress = Egress(proxies={"http": proxy}, no_proxy="", ssl_context=None, tls_key=None)

    async def run() -> object:
        return await _client(transport).get(url=BASE + "/models", headers={"x-k": "v"}, timeout_seconds=1, egress=egress)

    fetched = asyncio.run(run())
    assert (fetched.status_code, fetched.text, fetched.is_success) == (200, '{"data":[]}', True)
    sent = transport.sent[0]
    assert (sent.method, sent.payload, sent.egress) == ("GET", b"", egress)
    assert sent.headers["accept-encoding"] == "identity" and sent.headers["x-k"] == "v"
    assert transport.answered[0].ended == "kept"


def test_a_closed_client_refuses_as_latgates_own_state_not_the_upstreams() -> None:
    transport = MemoryTransport(lambda sent: MemoryResponse(200, {}, [b"{}"]))
    client = _client(transport)

    async def run() -> UpstreamFailure:
        await client.aclose()
        with pytest.raises(UpstreamFailure) as failure:
            await _post(client)
        return failure.value

    assert asyncio.run(run()).kind == "local"
    assert transport.closed and transport.sent == []


def _wrapped_refusal() -> OSError:
    wrapper = OSError("All connection attempts failed")  # anyio's, around the socket's own error
    wrapper.__cause__ = ConnectionRefusedError(111, "Connection refused")
    return wrapper


@pytest.mark.parametrize(
    ("raised", "kind", "message"),
    [
        (lambda: ConnectionRefusedError(111, f"Connection refused: {BASE}"), "connect", "could not connect to upstream: connection refused"),
        (_wrapped_refusal, "connect", "could not connect to upstream: connection refused"),
        (lambda: socket.gaierror(-2, f"Name or service not known: {BASE}"), "connect", "could not connect to upstream: DNS name not found"),
        (lambda: OSError(24, "Too many open files"), "local", "latgate has no free file descriptor or buffer for a new connection"),
        (lambda: TimeoutError(f"read from {BASE}"), "timeout", "upstream timed out"),
        (lambda: ConnectionResetError(104, KEY), "read", "upstream connection failed (connection reset)"),
        (lambda: ValueError(f"bad header {KEY}"), "request", "the request could not be sent (check the provider's key and URL)"),
    ],
)
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_every_transport_exception_becomes_one_kind_naming_no_url_or_key(raised, kind: str, message: str, method: str) -> None:
    def fail(sent: Sent) -> MemoryResponse:
        raise raised()

    async def run() -> UpstreamFailure:
        client = _client(MemoryTransport(fail))
        with pytest.raises(UpstreamFailure) as failure:
            if method == "POST":
                await _post(client)
            else:
                await client.get(url=BASE + "/models", headers={}, timeout_seconds=1)
        return failure.value

    failure = asyncio.run(run())
    assert (failure.kind, str(failure)) == (kind, message)
    assert "up.test" not in str(failure) and KEY not in str(failure)


def test_a_gets_body_broken_mid_read_is_a_read_failure_and_its_response_is_closed() -> None:
    transport = MemoryTransport(lambda sent: MemoryResponse(200, {}, [b"{", ConnectionResetError(104, "reset")]))

    async def run() -> UpstreamFailure:
        with pytest.raises(UpstreamFailure) as failure:
            await _client(transport).get(url=BASE + "/models", headers={}, timeout_seconds=1)
        return failure.value

    assert asyncio.run(run()).kind == "read"
    assert transport.answered[0].ended == "kept"


def test_the_whole_gateway_runs_over_a_transport_given_to_create_app() -> None:
    def answer(sent: Sent) -> MemoryResponse:
        if sent.method == "GET":  # health probes, catalog reads
            return MemoryResponse(200, {"content-type": "application/json"}, [b"{}"])
        if json.loads(sent.payload).get("stream"):
            events = ROLE + content("from") + content(" memory") + event(chat_chunk({}, finish_reason="stop")) + DONE
            return MemoryResponse(200, {"content-type": "text/event-stream"}, [events[:40], events[40:]])
        return MemoryResponse(200, {"content-type": "application/json"}, [json.dumps(chat_completion()).encode()])

    transport = MemoryTransport(answer)
    config = load_config_text(
        f'[defaults]\nmax_retries = 0\n[providers.up]\napi_base = "{BASE}"\nmodels = ["m"]\n', source="t.toml"
    )
    with serve_app(create_app(config, transport=transport)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        whole = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert whole.choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "from memory"
    posts = [(sent.url, sent.group) for sent in transport.sent if sent.method == "POST"]
    assert posts == [(BASE + "/chat/completions", "up")] * 2
    assert all(response.ended == "kept" for response in transport.answered)
