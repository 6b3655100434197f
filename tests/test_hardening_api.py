"""latgate's own API under generated input: schemathesis against its OpenAPI document
(bounded example count) finds no 5xx, the document lists every route latgate serves,
and bad bodies of every kind get 400 envelopes."""

from __future__ import annotations

import re

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from stack import FAST, gateway, simulators

from latgate.api.routes import openapi_document
from latgate.app.asgi import app_routes, create_app
from latgate.commands.sim import SimOptions
from latgate.foundation.config import load_config_text

SCHEMA = schemathesis.openapi.from_dict(openapi_document(version="test", extra=app_routes()))
SCHEMA.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], deterministic=True, database="none"
)
EXAMPLES_PER_OPERATION = 12

CONFIG = """
[defaults]
timeout_sec = 10
max_retries = 0

[providers.sim]
api_base = "{base}/v1"
"""


@pytest.fixture(scope="module")
def served():
    options = SimOptions(name="sim", seed=1, max_output_tokens=4, **FAST)
    with simulators({"sim": options}) as sims, gateway(CONFIG.format(base=sims["sim"][0])) as gw:
        yield gw.url


@SCHEMA.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests_never_get_a_5xx(case, served) -> None:
    response = case.call(base_url=served, timeout=10)
    case.validate_response(response, checks=[not_a_server_error])


def test_openapi_document_is_served_and_lists_every_route_latgate_serves(served) -> None:
    document = httpx.get(served + "/openapi.json").json()
    assert document == openapi_document(version=document["info"]["version"], extra=app_routes())
    app = create_app(load_config_text('[providers.a]\napi_base = "http://127.0.0.1:9"\n', source="t", env={}))
    served_paths = set(app._hot) | {
        route.path.replace("{model_id:path}", "{model_id}")
        for route in app.fastapi.routes
        if hasattr(route, "methods")
    }
    assert served_paths - {"/openapi.json"} <= set(document["paths"])


BAD_BODIES = [
    ("malformed JSON", b'{"model": "m", "messages": [', "not valid JSON"),
    ("invalid UTF-8", b'{"model": "m\xff", "messages": []}', "UTF-8"),
    ("empty body", b"", "empty"),
    ("not an object", b"[1, 2, 3]", "JSON object"),
    ("model is a number", b'{"model": 5, "messages": []}', "model"),
    ("messages is a string", b'{"model": "m", "messages": "hi"}', "messages"),
    ("stream is a string", b'{"model": "m", "messages": [], "stream": "yes"}', "stream"),
    (
        "content part type is a list",
        b'{"model": "m", "messages": [{"role": "user", "content": [{"type": []}]}], "max_tokens": 1}',
        None,
    ),
    (
        "tools nested 300 deep",
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": ['
        + b'{"a": ' * 300
        + b"1"
        + b"}" * 300
        + b"]}",
        "nested",
    ),
    (
        "nested 400 deep",
        b'{"model": "m", "messages": ['
        + b'{"role": "user", "content": [' * 400
        + b'"x"'
        + b"]}" * 400
        + b"]}",
        None,
    ),
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/admin/route"])
@pytest.mark.parametrize(("what", "content", "words"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_bodies_get_a_400_envelope_never_a_500(
    served, path: str, what: str, content: bytes, words: str | None
) -> None:
    r = httpx.post(served + path, content=content, headers={"content-type": "application/json"})
    assert r.status_code in (200, 400), (
        what
    )  # a part type the gateway does not know is the upstream's business
    if r.status_code == 400:
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])  # a fresh id, never "-"
        if words:
            assert words in error["message"]
    assert "Traceback" not in r.text


@pytest.mark.parametrize(
    ("headers", "content", "code", "param"),
    [
        ({"X-Latgate-Priority": "urgent"}, None, "invalid_header_value", "X-Latgate-Priority"),
        ({"X-Latency-Budget-Ms": "fast"}, None, "invalid_header_value", "X-Latency-Budget-Ms"),
        ({"X-Latency-Sensitive": "maybe"}, None, "invalid_header_value", "X-Latency-Sensitive"),
        ({}, b'{"model": "m", "messages": [', "invalid_json", None),
        ({}, b"", "invalid_json", None),
        ({}, b"[1, 2, 3]", "invalid_type", None),
    ],
    ids=["priority", "budget", "sensitive", "not JSON", "empty", "not an object"],
)
def test_a_bad_header_value_or_body_has_an_error_code(
    served, headers: dict[str, str], content: bytes | None, code: str, param: str | None
) -> None:
    body = content if content is not None else b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    r = httpx.post(served + "/v1/chat/completions", content=body, headers={"content-type": "application/json", **headers})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
