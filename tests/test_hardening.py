"""Hardening: bounded request heads, secrets kept out of responses and logs, upstream TLS
verified by default, and nothing of the client's connection or credentials forwarded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import threading
from collections.abc import Iterator

import httpx
import pytest
import trustme
import uvicorn
from completions import CHAT_BODY, chat_completion
from replay import ReplayScript, load_stream, replay_server, split_points
from servers import listening_socket, serve_like_latgate_serve
from stack import FAST, gateway

from latgate.app.asgi import create_app
from latgate.app.httplimits import MAX_FIELD_BYTES, MAX_FIELDS, MAX_HEAD_BYTES
from latgate.commands.sim import SimOptions, create_sim_app
from latgate.foundation.config import load_config_text
from latgate.transport.upstream import UpstreamClient, UpstreamFailure

COMPLETION = chat_completion()
SECRET = "sk-upstream-9f8e7d6c5b4a"


def raw_exchange(port: int, head: bytes, *, body: bytes = b"", pieces: int = 1) -> bytes:
    """Send ``head`` (+ ``body``) on a new connection, ``pieces`` writes for the head;
    return everything the server sent until it closed or went quiet for 5 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        step = max(1, len(head) // pieces)
        with contextlib.suppress(OSError):  # the server may close while we are still writing
            for start in range(0, len(head), step):
                conn.sendall(head[start : start + step])
            conn.sendall(body)
        received = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                received += chunk
                if b"\r\n\r\n" in received and (
                    b"connection: close" in received.lower() or len(received) > 200_000
                ):
                    break
        return received


@pytest.fixture(scope="module")
def latgate_port():
    with replay_server(ReplayScript.json_response(200, COMPLETION)) as upstream:
        config = load_config_text(
            f'[providers.up]\napi_base = "{upstream.base_url}"\n', source="t.toml", env={}
        )
        with serve_like_latgate_serve(create_app(config)) as port:
            yield port


def request_head(*fields: bytes, target: bytes = b"/v1/models") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + b"".join(f + b"\r\n" for f in fields) + b"\r\n"


@pytest.mark.parametrize(
    ("what", "head", "pieces"),
    [
        ("one huge field", request_head(b"X-Big: " + b"a" * (MAX_FIELD_BYTES + 1)), 1),
        ("too many fields", request_head(*(b"X-F%d: v" % i for i in range(MAX_FIELDS + 1))), 1),
        ("a huge head", request_head(*(b"X-F%d: " % i + b"b" * 1000 for i in range(80))), 1),
        ("a long request line", request_head(target=b"/" + b"p" * MAX_HEAD_BYTES), 1),
        ("a field that never ends", b"GET / HTTP/1.1\r\nX-Endless: " + b"c" * (2 * MAX_HEAD_BYTES), 40),
    ],
)
def test_oversized_request_heads_get_431_in_the_openai_envelope(
    latgate_port: int, what: str, head: bytes, pieces: int
) -> None:
    answer = raw_exchange(latgate_port, head, pieces=pieces)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 431 Request Header Fields Too Large", what
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["error"]["code"] == "request_header_fields_too_large"


def test_ordinary_heads_with_large_bodies_pass_on_a_kept_alive_connection(latgate_port: int) -> None:
    content = json.dumps({**CHAT_BODY, "pad": "x" * 200_000}).encode()
    with httpx.Client(base_url=f"http://127.0.0.1:{latgate_port}") as client:
        headers = {f"x-h{i}": "v" * 200 for i in range(40)}
        for _ in range(3):
            r = client.post(
                "/v1/chat/completions",
                content=content,
                headers={**headers, "content-type": "application/json"},
            )
            assert r.status_code == 200
        assert client.get("/v1/models").status_code == 200


# -- secrets ---------------------------------------------------------------------------


FAULTS = {
    "401 echoing the key": ReplayScript.json_response(
        401, {"error": {"message": f"Incorrect API key provided: {SECRET}"}}
    ),
    "500 naming hosts": ReplayScript.json_response(
        500, {"error": {"message": "backend http://10.1.2.3:8000/v1 failed; key " + SECRET}}
    ),
    "error event first": ReplayScript.sse(
        b'data: {"error": {"message": "upstream http://10.9.9.9/x rejected ' + SECRET.encode() + b'"}}\n\n'
    ),
    "dies mid-stream": ReplayScript.sse(
        load_stream("vllm_chat")[: split_points(load_stream("vllm_chat"), "events")[3]], end="drop"
    ),
    "ok": ReplayScript.json_response(200, COMPLETION),
}


SECRET_CASES = [
    (fault, stream)
    for fault in FAULTS
    for stream in (False, True)
    if not (fault == "error event first" and not stream)
]


@pytest.mark.parametrize(("fault", "stream"), SECRET_CASES)
def test_no_upstream_key_internal_url_or_traceback_in_responses_or_logs(
    caplog, fault: str, stream: bool
) -> None:
    caplog.set_level(logging.DEBUG)
    with replay_server(FAULTS[fault]) as upstream:
        port = upstream.base_url.split(":")[2].split("/")[0]
        text = f'[defaults]\nmax_retries = 0\n\n[providers.up]\napi_base = "{upstream.base_url}"\napi_key_env = "UP_KEY"\n'
        with gateway(text, env={"UP_KEY": SECRET}) as gw:
            r = httpx.post(gw.v1 + "/chat/completions", json={**CHAT_BODY, "stream": stream})
            metrics = httpx.get(gw.url + "/metrics").text
            providers = httpx.get(gw.url + "/admin/providers").text
        assert upstream.requests[0].header("authorization") == f"Bearer {SECRET}"  # the key did go upstream
    surfaces = {
        "response": r.text + json.dumps(dict(r.headers)),
        "metrics": metrics,
        "admin": providers,
        "logs": "\n".join(
            record.getMessage() + (record.exc_text or "") + str(record.exc_info or "")
            for record in caplog.records
        ),
    }
    for where, text in surfaces.items():
        assert SECRET not in text, where
        assert f"127.0.0.1:{port}" not in text and "10.1.2.3" not in text and "10.9.9.9" not in text, where
        assert "Traceback" not in text, where
    assert all(record.exc_info is None for record in caplog.records)


# -- TLS -------------------------------------------------------------------------------


@contextlib.contextmanager
def tls_simulator() -> Iterator[tuple[str, trustme.CA]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    with cert.cert_chain_pems[0].tempfile() as certfile, cert.private_key_pem.tempfile() as keyfile:
        sock = listening_socket()
        app = create_sim_app(SimOptions(name="tls", **FAST))
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", http="h11", ssl_certfile=certfile, ssl_keyfile=keyfile
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
        thread.start()
        try:
            yield f"https://127.0.0.1:{sock.getsockname()[1]}", ca
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()


def test_upstream_tls_is_verified_by_default() -> None:
    with tls_simulator() as (origin, _ca):
        with gateway(f'[defaults]\nmax_retries = 0\n\n[providers.tls]\napi_base = "{origin}/v1"\n') as gw:
            r = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY)
            assert r.status_code == 502
            assert r.json()["error"]["code"] == "upstream_unavailable"

        async def attempt(verify: bool | ssl.SSLContext) -> int:
            client = UpstreamClient(
                connect_timeout_seconds=2,
                read_timeout_seconds=2,
                **({} if verify is True else {"verify": verify}),
            )
            try:
                response = await client.open(
                    url=origin + "/v1/chat/completions",
                    payload=json.dumps(CHAT_BODY).encode(),
                    headers={"content-type": "application/json"},
                )
                await response.aread()
                await response.aclose()
                return response.status_code
            finally:
                await client.aclose()

        with pytest.raises(UpstreamFailure) as failed:
            asyncio.run(attempt(True))  # the default
        assert failed.value.kind == "connect"
        assert asyncio.run(attempt(False)) == 200  # the same server, unverified: it was the certificate


# -- what goes upstream ------------------------------------------------------------------


CLIENT_HEADERS = {
    "Authorization": "Bearer sk-client-credential",
    "x-api-key": "sk-client-credential-2",
    "Proxy-Authorization": "Basic c2VjcmV0",
    "Cookie": "session=client-cookie",
    "Connection": "keep-alive, X-Hop",
    "Keep-Alive": "timeout=5",
    "X-Hop": "hop-value",
    "TE": "trailers",
    "Upgrade": "websocket-please",
    "Proxy-Connection": "keep-alive",
    "Forwarded": "for=192.0.2.60",
    "X-Forwarded-For": "192.0.2.61",
    "Anthropic-Version": "2023-06-01",
}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_hop_by_hop_headers_cookies_and_client_credentials_never_go_upstream(path: str) -> None:
    bodies = {
        "/v1/chat/completions": CHAT_BODY,
        "/v1/messages": {"model": "m", "max_tokens": 5, "messages": CHAT_BODY["messages"]},
        "/v1/responses": {"model": "m", "input": "hi"},
    }
    with replay_server(
        ReplayScript.json_response(
            200, COMPLETION, headers=[("set-cookie", "upstream=1"), ("x-upstream-internal", "yes")]
        )
    ) as upstream:
        with gateway(
            f'[providers.up]\napi_base = "{upstream.base_url}"\napi_key_env = "UP_KEY"\n',
            env={"UP_KEY": SECRET},
        ) as gw:
            r = httpx.post(gw.url + path, json=bodies[path], headers=CLIENT_HEADERS)
        assert r.status_code == 200
        sent = upstream.requests[0]
    names = {name.lower() for name, _ in sent.headers}
    values = " ".join(value for _, value in sent.headers)
    for header, value in CLIENT_HEADERS.items():
        assert value not in values, header
    assert not names & {
        "cookie",
        "proxy-authorization",
        "keep-alive",
        "x-hop",
        "te",
        "upgrade",
        "proxy-connection",
        "x-api-key",
        "forwarded",
        "x-forwarded-for",
    }
    assert sent.header("authorization") == f"Bearer {SECRET}"
    assert "set-cookie" not in r.headers and "x-upstream-internal" not in r.headers


# -- body size ---------------------------------------------------------------------------


def test_oversized_bodies_get_413_with_the_limit_declared_or_streamed() -> None:
    with replay_server(ReplayScript.json_response(200, COMPLETION)) as upstream:
        text = f'[server]\nmax_body_bytes = 1000\n\n[providers.up]\napi_base = "{upstream.base_url}"\n'
        with gateway(text) as gw:
            declared = httpx.post(
                gw.v1 + "/chat/completions", content=b"x" * 5000, headers={"content-type": "application/json"}
            )
            streamed = httpx.post(
                gw.v1 + "/chat/completions",
                content=iter([b"x" * 600, b"x" * 600, b"x" * 600]),
                headers={"content-type": "application/json"},
            )
            fits = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY)
        assert sum(1 for r in upstream.requests if r.method == "POST") == 1
    assert (
        declared.status_code == 413
        and "5000" in declared.json()["error"]["message"]
        and "1000" in declared.json()["error"]["message"]
    )
    assert streamed.status_code == 413 and "1000" in streamed.json()["error"]["message"]
    assert (
        streamed.request.headers["transfer-encoding"] == "chunked"
    )  # no size declared: caught while reading
    assert fits.status_code == 200
