"""What a gateway key is told is what it may use: ``/v1/models`` and
``/v1/models/{id}`` show only the models on its allow-list, a 404 for a model it asks
about names only those, an ``X-Route-To`` 400 only the providers serving them; and a
header latgate acts on (``Authorization``, ``X-Latency-Budget-Ms``, a session header,
``Content-Type``, ...) sent twice is refused with a 400 naming it, in the route's
envelope, instead of acting on the first.
Through a real gateway (the openai SDK, httpx) and a replayed upstream."""

from __future__ import annotations

import anthropic
import httpx
import openai
import orjson
import pytest
from completions import chat_completion
from replay import ReplayScript, replay_server
from stack import gateway

CONFIG = """
[providers.public]
api_base = "{base}"
models = ["m"]
[providers.internal]
api_base = "{base}"
models = ["secret-model"]
[routing]
default_route = "public"
allow_route_override = true
[[auth.keys]]
name = "narrow"
key = "sk-narrow"
models = ["m"]
[[auth.keys]]
name = "wide"
key = "sk-wide"
"""
NARROW = {"authorization": "Bearer sk-narrow"}


@pytest.fixture(scope="module")
def stack():
    with replay_server(ReplayScript.json_response(200, chat_completion())) as up, gateway(CONFIG.format(base=up.base_url)) as gw:
        yield gw


def test_the_model_list_shows_only_what_the_key_may_use(stack) -> None:
    narrow = openai.OpenAI(base_url=stack.v1, api_key="sk-narrow", max_retries=0)
    assert [model.id for model in narrow.models.list()] == ["m"]
    with pytest.raises(openai.NotFoundError) as missing:
        narrow.models.retrieve("secret-model")
    assert "secret-model" not in missing.value.response.json()["error"]["message"].split("use:")[1]
    assert narrow.models.retrieve("m").id == "m"
    wide = openai.OpenAI(base_url=stack.v1, api_key="sk-wide", max_retries=0)
    assert sorted(model.id for model in wide.models.list()) == ["m", "secret-model"]


def test_a_404_names_only_the_models_the_key_may_use(stack) -> None:
    answer = httpx.get(stack.v1 + "/models/nope", headers=NARROW, timeout=10)
    assert answer.status_code == 404, answer.text
    message = answer.json()["error"]["message"]
    assert "secret-model" not in message and "models this key may use: m" in message, message


def test_an_x_route_to_400_names_only_the_providers_serving_the_keys_models(stack) -> None:
    headers = {**NARROW, "x-route-to": "nowhere"}
    answer = httpx.post(stack.v1 + "/chat/completions", headers=headers, json={"model": "m", "messages": []}, timeout=10)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert "internal" not in message and "providers this key may use: public" in message, message
    assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == ("invalid_header_value", "X-Route-To")


@pytest.mark.parametrize("header", ["Authorization", "X-Latency-Budget-Ms"])
def test_a_header_latgate_acts_on_sent_twice_is_refused_naming_it(stack, header: str) -> None:
    values = ["Bearer sk-wide", "Bearer sk-narrow"] if header == "Authorization" else ["10", "100000"]
    headers = [(header, value) for value in values]
    if header != "Authorization":
        headers.append(("Authorization", "Bearer sk-wide"))
    answer = httpx.post(stack.v1 + "/chat/completions", headers=headers, json={"model": "m", "messages": []}, timeout=10)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "duplicate_header" and error["param"] == header and header in error["message"]


SESSION_AND_MEDIA_HEADERS = [
    ("x-claude-code-session-id", "s1", "s2"),
    ("X-Session-Id", "s1", "s2"),
    ("session-id", "s1", "s2"),
    ("x-codex-session-id", "s1", "s2"),
    ("Content-Type", "application/json", "text/plain"),
]


@pytest.mark.parametrize(("header", "first", "second"), SESSION_AND_MEDIA_HEADERS)
@pytest.mark.parametrize("path", ["/chat/completions", "/responses", "/messages"])
def test_a_session_header_or_content_type_sent_twice_is_refused_in_the_routes_envelope(
    stack, path: str, header: str, first: str, second: str
) -> None:
    """Which session a turn belongs to (or how its body reads) would be a guess: a 400
    naming the header, as for the other headers latgate acts on, in the route's envelope."""
    body = {
        "/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        "/responses": {"model": "m", "input": "hi", "store": False},
        "/messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    }[path]
    headers = [("Authorization", "Bearer sk-wide"), (header, first), (header, second)]
    if header != "Content-Type":
        headers.append(("Content-Type", "application/json"))
    answer = httpx.post(stack.v1 + path, headers=headers, content=orjson.dumps(body), timeout=10)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    if path == "/messages":
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
        assert f"the {header} header was sent more than once" in error["error"]["message"], error
    else:
        assert error["error"]["code"] == "duplicate_header" and error["error"]["param"] == header, error
        assert f"the {header} header was sent more than once" in error["error"]["message"], error


def test_a_duplicate_header_on_messages_is_refused_in_the_anthropic_envelope(stack) -> None:
    headers = [("x-api-key", "sk-wide"), ("X-Latency-Budget-Ms", "10"), ("X-Latency-Budget-Ms", "20")]
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(stack.v1 + "/messages", headers=headers, json=body, timeout=10)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert "X-Latency-Budget-Ms" in error["error"]["message"], error


@pytest.mark.parametrize("path", ["/admin/providers", "/ui/state", "/v1/models"])
def test_two_keys_on_the_admin_ui_and_model_list_paths_are_refused(stack, path: str) -> None:
    headers = [("Authorization", "Bearer sk-wide"), ("Authorization", "Bearer sk-narrow")]
    answer = httpx.get(stack.url + path, headers=headers, timeout=10)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "duplicate_header" and error["param"] == "Authorization", error


def test_a_priority_sent_twice_is_refused_naming_it(stack) -> None:
    headers = [("Authorization", "Bearer sk-wide"), ("X-Latgate-Priority", "batch"), ("X-Latgate-Priority", "interactive")]
    answer = httpx.post(stack.v1 + "/chat/completions", headers=headers, json={"model": "m", "messages": []}, timeout=10)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "X-Latgate-Priority"


def test_with_a_key_in_both_authorization_and_x_api_key_the_bearer_key_is_the_one_used(stack) -> None:
    """As docs/keys-limits-scaling.md says: ``Authorization: Bearer`` wins, even when its
    key is unknown; ``x-api-key`` is read only when no Bearer key is sent."""
    for bearer, api_key, listed in (("sk-narrow", "sk-wide", ["m"]), ("sk-wide", "sk-narrow", ["m", "secret-model"])):
        sdk = openai.OpenAI(base_url=stack.v1, api_key=bearer, default_headers={"x-api-key": api_key}, max_retries=0)
        assert sorted(model.id for model in sdk.models.list()) == listed, (bearer, api_key)

    messages = [{"role": "user", "content": "hi"}]
    def both(bearer: str, api_key: str) -> anthropic.Anthropic:  # as Claude Code with both variables set
        return anthropic.Anthropic(
            base_url=stack.url, api_key=api_key, default_headers={"Authorization": f"Bearer {bearer}"}, max_retries=0
        )

    narrow_bearer = both("sk-narrow", "sk-wide")
    with pytest.raises(anthropic.PermissionDeniedError):
        narrow_bearer.messages.create(model="secret-model", max_tokens=8, messages=messages)
    wide_bearer = both("sk-wide", "sk-narrow")
    assert wide_bearer.messages.create(model="secret-model", max_tokens=8, messages=messages).content

    unknown_bearer = both("sk-guess", "sk-wide")
    with pytest.raises(anthropic.AuthenticationError):
        unknown_bearer.messages.create(model="m", max_tokens=8, messages=messages)
    basic = [("Authorization", "Basic Zm9vOmJhcg=="), ("x-api-key", "sk-narrow")]  # no Bearer key: x-api-key's
    assert httpx.get(stack.v1 + "/models", headers=basic, timeout=10).json()["data"][0]["id"] == "m"
