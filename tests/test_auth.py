"""Gateway keys: who may call, with which models and policy, and who may read /admin."""

from __future__ import annotations

import hashlib
import hmac

import anthropic
import httpx
import openai
import pytest
from completions import CHAT_BODY, chat_completion, proxied_posts
from replay import ReplayScript, replay_server
from stack import gateway

from latgate.foundation.config.schema import AuthConfig, AuthKey
from latgate.foundation.errors import AuthenticationFailed, PermissionDenied
from latgate.live.store import MemoryStore
from latgate.request.auth import AuthGuard, KeyRing, key_digest, presented_key

COMPLETION = chat_completion()
TEAM_B_SHA = hashlib.sha256(b"sk-team-b").hexdigest()

CONFIG = """
[providers.fast]
api_base = "{base}"
api_key_env = "FAST_KEY"
models = ["m", "n"]

[providers.slow]
api_base = "{base}"
models = ["m", "n"]

[routing]
default_route = "slow"

[routing.policies.interactive]
route_to = "fast"

[[auth.keys]]
name = "team-a"
key = "${{env:TEAM_A_KEY}}"
models = ["m"]
policy = "interactive"

[[auth.keys]]
name = "team-b"
key_sha256 = "{team_b_sha}"

[[auth.keys]]
name = "ops"
key = "sk-ops"
admin = true
"""
ENV = {"TEAM_A_KEY": "sk-team-a", "FAST_KEY": "upstream-secret"}


def auth_config(base: str) -> str:
    return CONFIG.format(base=base, team_b_sha=TEAM_B_SHA)


@pytest.fixture(scope="module")
def served():
    with (
        replay_server(ReplayScript.json_response(200, COMPLETION)) as upstream,
        gateway(auth_config(upstream.base_url), env=ENV) as gw,
    ):
        yield gw, upstream


def test_request_without_a_key_gets_401_in_the_openai_envelope_and_never_goes_upstream(served) -> None:
    gw, upstream = served
    before = proxied_posts(upstream)
    r = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert r.json()["error"]["code"] == "missing_api_key"
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert proxied_posts(upstream) == before


def test_unknown_key_gets_401_and_the_key_is_not_echoed(served) -> None:
    gw, _ = served
    r = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers={"Authorization": "Bearer sk-guess-1234"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert "sk-guess" not in r.text and "1234" not in r.text


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer sk-team-b"},
        {"Authorization": "bearer sk-team-b"},
        {"x-api-key": "sk-team-b"},
        {"Authorization": "Basic Zm9vOmJhcg==", "x-api-key": "sk-team-b"},
    ],
)
def test_key_stored_as_sha256_is_accepted_as_bearer_or_x_api_key(served, headers) -> None:
    gw, _ = served
    r = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=headers)
    assert r.status_code == 200


def test_client_key_is_never_forwarded_upstream_and_the_provider_gets_its_own(served) -> None:
    gw, upstream = served
    r = httpx.post(
        gw.v1 + "/chat/completions",
        json=CHAT_BODY,
        headers={"Authorization": "Bearer sk-team-a", "x-api-key": "sk-team-a"},
    )
    assert r.status_code == 200 and r.headers["x-latgate-provider"] == "fast"
    sent = [r for r in upstream.requests if r.method == "POST"][-1]
    assert sent.header("authorization") == "Bearer upstream-secret"
    assert sent.header("x-api-key") is None
    assert b"sk-team-a" not in sent.body and all("sk-team-a" not in v for _, v in sent.headers)


def test_model_outside_the_keys_allow_list_gets_403_naming_the_param(served) -> None:
    gw, upstream = served
    before = proxied_posts(upstream)
    r = httpx.post(
        gw.v1 + "/chat/completions", json={**CHAT_BODY, "model": "n"}, headers={"x-api-key": "sk-team-a"}
    )
    assert r.status_code == 403
    error = r.json()["error"]
    assert (
        error["type"] == "permission_error"
        and error["param"] == "model"
        and error["code"] == "model_not_allowed"
    )
    assert "team-a" in error["message"]
    assert proxied_posts(upstream) == before


def test_keys_policy_is_the_default_route_policy_and_a_header_still_overrides_it(served) -> None:
    gw, _ = served
    key = {"Authorization": "Bearer sk-team-a"}
    r = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=key)
    assert (r.headers["x-latgate-provider"], r.headers["x-latgate-route-reason"]) == (
        "fast",
        "policy:interactive",
    )
    other = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers={"Authorization": "Bearer sk-team-b"})
    assert (other.headers["x-latgate-provider"], other.headers["x-latgate-route-reason"]) == (
        "slow",
        "default",
    )


def test_admin_routes_need_an_admin_key_while_probes_and_metrics_stay_open(served) -> None:
    gw, _ = served
    assert httpx.get(gw.url + "/admin/providers").status_code == 401
    denied = httpx.get(gw.url + "/admin/providers", headers={"Authorization": "Bearer sk-team-b"})
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "admin_key_required"
    allowed = httpx.get(gw.url + "/admin/providers", headers={"Authorization": "Bearer sk-ops"})
    assert allowed.status_code == 200 and "fast" in allowed.json()["providers"]
    assert (
        httpx.post(gw.url + "/admin/reload", headers={"Authorization": "Bearer sk-team-b"}).status_code == 403
    )
    for path in ("/", "/healthz", "/readyz", "/metrics"):
        assert httpx.get(gw.url + path).status_code == 200, path


def test_model_list_needs_a_key(served) -> None:
    gw, _ = served
    assert httpx.get(gw.v1 + "/models").status_code == 401
    assert httpx.get(gw.url + "/models/m").status_code == 401
    r = httpx.get(gw.v1 + "/models", headers={"Authorization": "Bearer sk-team-b"})
    assert r.status_code == 200 and {m["id"] for m in r.json()["data"]} >= {"m", "n"}


def test_openai_sdk_with_a_gateway_key_works_and_a_wrong_key_raises_authentication_error(served) -> None:
    gw, _ = served
    ok = openai.OpenAI(base_url=gw.v1, api_key="sk-team-b", max_retries=0)
    assert ok.chat.completions.create(model="m", messages=CHAT_BODY["messages"]).choices[0].message.content == "ok"
    bad = openai.OpenAI(base_url=gw.v1, api_key="sk-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=CHAT_BODY["messages"])


def test_anthropic_messages_route_checks_the_key_and_answers_in_its_own_envelope(served) -> None:
    gw, _ = served
    r = httpx.post(gw.v1 + "/messages", json={"model": "m", "max_tokens": 5, "messages": CHAT_BODY["messages"]})
    assert r.status_code == 401
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
    client = anthropic.Anthropic(base_url=gw.url, api_key="sk-team-b", max_retries=0)
    message = client.messages.create(model="m", max_tokens=5, messages=CHAT_BODY["messages"])
    assert message.content[0].text == "ok"


def test_without_an_auth_section_no_key_is_needed_on_any_route() -> None:
    text = '[providers.up]\napi_base = "{base}"\n'
    with (
        replay_server(ReplayScript.json_response(200, COMPLETION)) as upstream,
        gateway(text.format(base=upstream.base_url)) as gw,
    ):
        assert httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY).status_code == 200
        assert httpx.get(gw.url + "/admin/providers").status_code == 200


# -- units ---------------------------------------------------------------------------


def test_presented_key_prefers_a_bearer_token_and_falls_back_to_x_api_key() -> None:
    assert presented_key({"authorization": "Bearer  abc "}) == "abc"
    assert presented_key({"authorization": "Basic abc", "x-api-key": "k"}) == "k"
    assert presented_key({"authorization": "Bearer", "x-api-key": "k"}) == "k"
    assert presented_key({"authorization": "Bearer "}) is None
    assert presented_key({}) is None


def test_key_digest_matches_sha256sum_of_the_key() -> None:
    assert key_digest("sk-team-b").hex() == TEAM_B_SHA


def test_every_stored_digest_is_compared_whichever_key_matches(monkeypatch) -> None:
    ring = KeyRing([AuthKey(name=f"k{i}", key=f"sk-{i}") for i in range(5)])
    calls: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for presented in ("sk-0", "sk-4", "nope"):
        calls.clear()
        caller = ring.match(presented)
        assert len(calls) == 5
        assert (caller.name if caller else None) == {"sk-0": "k0", "sk-4": "k4", "nope": None}[presented]


def test_oversized_presented_key_is_refused_without_hashing() -> None:
    ring = KeyRing([AuthKey(name="a", key="sk-a")])
    assert ring.match("x" * 5000) is None


def test_guard_raises_typed_errors() -> None:
    guard = AuthGuard(
        config=AuthConfig(
            keys=(AuthKey(name="a", key="sk-a", models=("m",)), AuthKey(name="root", key="sk-r", admin=True))
        ),
        store=MemoryStore(),
        fail_open=True,
    )
    with pytest.raises(AuthenticationFailed):
        guard.authenticate({})
    caller = guard.authenticate({"x-api-key": "sk-a"})
    with pytest.raises(PermissionDenied):
        guard.authorize_admin({"x-api-key": "sk-a"})
    assert guard.authorize_admin({"x-api-key": "sk-r"}).name == "root"
    guard.check_model(caller, "m")
    with pytest.raises(PermissionDenied):
        guard.check_model(caller, "other")
