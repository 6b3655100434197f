"""What a request body may be sent as: JSON (any ``application/json`` or ``+json``
type, or no type), or ``application/x-www-form-urlencoded``, the type ``curl -d`` sends
when no ``-H 'Content-Type: ...'`` is given, read as JSON. Any other type, and any
``Content-Encoding`` but ``identity``, is a 415 naming it, in the API's envelope, on
every API of the route table, and nothing goes upstream."""

from __future__ import annotations

import gzip
import json
import logging
import subprocess
from collections.abc import Iterator

import httpx
import pytest
from apis import APIS, body_for, error_type
from h1_upstreams import CHAT, OK_JSON, SECRET, RawUpstream, config, json_reply, keep_serving
from stack import gateway, one_upstream_config

from latgate.api.serve import Api


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    with gateway(one_upstream_config("http://127.0.0.1:9")) as gw:  # nothing listens there
        yield gw.url


@pytest.fixture
def access_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="latgate.access")
    return caplog


def refused(api: Api, answer: httpx.Response, access_log: pytest.LogCaptureFixture) -> str:
    """The 415's message, asserting its envelope and its access line."""
    assert answer.status_code == 415, answer.text
    assert error_type(api, answer.json()) == "invalid_request_error"
    assert answer.headers["x-should-retry"] == "false"
    lines = [json.loads(r.getMessage()) for r in access_log.records if r.name == "latgate.access"]
    assert [(line["path"], line["status"]) for line in lines] == [(api.paths[0], 415)]
    body = answer.json()
    return body["error"]["message"]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd, gzip"])
def test_a_compressed_body_is_415_naming_its_encoding(api: Api, encoding: str, served: str, access_log) -> None:
    packed = gzip.compress(json.dumps(body_for(api)).encode())
    headers = {"content-type": "application/json", "content-encoding": encoding}
    message = refused(api, httpx.post(served + api.paths[0], content=packed, headers=headers), access_log)
    assert f"Content-Encoding {encoding!r} is not supported" in message and "UTF-8" not in message, message


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("media_type", ["text/xml", "text/plain; charset=utf-8", "multipart/form-data; boundary=x"])
def test_a_body_of_another_type_is_415_naming_it(api: Api, media_type: str, served: str, access_log) -> None:
    headers = {"content-type": media_type}
    answer = httpx.post(served + api.paths[0], content=json.dumps(body_for(api)), headers=headers)
    message = refused(api, answer, access_log)
    assert f"Content-Type {media_type.split(';')[0]!r} is not supported" in message, message
    assert "application/json" in message


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "application/json"},  # the openai and anthropic SDKs
        {"content-type": "Application/JSON; charset=UTF-8"},
        {"content-type": "application/vnd.example+json"},
        {"content-type": "application/json", "content-encoding": "identity"},
        {},  # no type at all
    ],
    ids=["json", "json-charset", "plus-json", "identity", "none"],
)
def test_json_bodies_and_untyped_ones_go_upstream(headers: dict[str, str]) -> None:
    with RawUpstream(keep_serving(json_reply())) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        answer = httpx.post(gw.v1 + "/chat/completions", content=json.dumps(CHAT), headers=headers, timeout=15)
    assert answer.status_code == 200 and answer.content == OK_JSON, answer.text
    assert len(up.requests) == 1


def test_curl_d_without_a_content_type_is_read_as_json() -> None:
    """``curl -d`` sends ``application/x-www-form-urlencoded``; the JSON it carries is
    what the user meant, as a quick test of a gateway usually is."""
    with RawUpstream(keep_serving(json_reply())) as up, gateway(config(up.base_url), env={"UP_KEY": SECRET}) as gw:
        result = subprocess.run(
            ["curl", "-sS", "--noproxy", "*", "-v", gw.v1 + "/chat/completions", "-d", json.dumps(CHAT)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    assert "Content-Type: application/x-www-form-urlencoded" in result.stderr  # what curl sent
    assert result.returncode == 0 and result.stdout.encode() == OK_JSON, result.stdout + result.stderr
    assert len(up.requests) == 1
