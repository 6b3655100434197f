"""A token-limit field no engine can take (``max_tokens: 1e20``, ``2.5``, ``0``, a
string; a float, even ``10.0``) is refused by latgate itself with a 400 saying what is wrong, naming the field
the client sent, in every route's envelope: ``max_tokens`` / ``max_completion_tokens``
on chat completions, ``max_tokens`` on completions and ``/v1/messages``,
``max_output_tokens`` on the Responses API (whose translation would have named the
upstream's ``max_completion_tokens``), and on ``/admin/route``. Nothing goes upstream. Through a real gateway,
a replayed upstream and the openai / anthropic SDKs."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from completions import chat_completion
from replay import ReplayScript
from stack import replay_gateway

TOO_LARGE = 1e20
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def stack():
    with replay_gateway(ReplayScript.json_response(200, chat_completion())) as (upstream, gw):
        yield upstream, gw


def _openai(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="sk-test", max_retries=0)


def _anthropic(gw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="sk-test", max_retries=0)


SENDS = {
    "chat max_tokens": ("max_tokens", lambda gw, v: _openai(gw).chat.completions.create(model="m", messages=USER, max_tokens=v)),
    "chat max_completion_tokens": (
        "max_completion_tokens",
        lambda gw, v: _openai(gw).chat.completions.create(model="m", messages=USER, max_completion_tokens=v),
    ),
    "completions": ("max_tokens", lambda gw, v: _openai(gw).completions.create(model="m", prompt="hi", max_tokens=v)),
    "responses": (
        "max_output_tokens",
        lambda gw, v: _openai(gw).responses.create(model="m", input="hi", store=False, max_output_tokens=v),
    ),
    "messages": (  # streamed: the SDK itself refuses a large max_tokens without a stream
        "max_tokens",
        lambda gw, v: _anthropic(gw).messages.create(model="m", messages=USER, max_tokens=v, stream=True),
    ),
}


def _refusal(gw, route: str, value) -> tuple[str, str, str | None]:
    """``(field, message, code)`` of the 400 the route's SDK raised for ``value``."""
    field, send = SENDS[route]
    error_type = anthropic.BadRequestError if route == "messages" else openai.BadRequestError
    with pytest.raises(error_type) as refused:
        send(gw, value)
    body = refused.value.response.json()
    if route == "messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        return field, body["error"]["message"], None
    assert body["error"]["param"] == field, body
    return field, body["error"]["message"], body["error"]["code"]


@pytest.mark.parametrize("route", list(SENDS))
def test_a_token_limit_too_large_is_called_too_large_on_every_route(stack, route: str) -> None:
    upstream, gw = stack
    before = upstream.connection_count
    field, message, code = _refusal(gw, route, TOO_LARGE)
    assert message == f"'{field}' is too large (1e+20 tokens); send an integer from 1 to 2147483647", message
    assert code in (None, "integer_above_max_value")
    assert "positive" not in message
    assert upstream.connection_count == before  # refused by latgate, not relayed from the upstream


@pytest.mark.parametrize(
    ("value", "said", "expected_code"),
    [
        (2.5, "must be a whole number of tokens, not 2.5", "invalid_type"),
        (0, "must be at least 1 token, not 0", "integer_below_min_value"),
        ("64", "must be an integer number of tokens, not a string", "invalid_type"),
        (2**31, "is too large (2147483648 tokens)", "integer_above_max_value"),
        (10.0, "must be an integer number of tokens, not the float 10.0; send 10", "invalid_type"),
    ],
)
@pytest.mark.parametrize("route", list(SENDS))
def test_each_kind_of_bad_token_limit_says_what_is_wrong(stack, route: str, value, said: str, expected_code) -> None:
    _, gw = stack
    field, message, code = _refusal(gw, route, value)
    assert message.startswith(f"'{field}' {said}"), message
    assert code in (None, expected_code)


def test_a_valid_token_limit_still_goes_through(stack) -> None:
    _, gw = stack
    assert _openai(gw).chat.completions.create(model="m", messages=USER, max_tokens=2**31 - 1).choices


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [("max_tokens", TOO_LARGE, "integer_above_max_value"), ("max_output_tokens", 10.0, "invalid_type"),
     ("max_completion_tokens", 0, "integer_below_min_value")],
)  # fmt: skip
def test_admin_route_refuses_the_token_limits_the_api_routes_refuse(stack, field: str, value, code: str) -> None:
    _, gw = stack
    body = {"model": "m", "messages": USER, field: value}
    answer = httpx.post(gw.url + "/admin/route", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == code and answer.json()["error"]["param"] == field
    assert httpx.post(gw.url + "/admin/route", json={**body, field: 64}, timeout=30).status_code == 200
