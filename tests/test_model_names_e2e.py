"""Model names through a running gateway, read by the openai SDK: exact names go to the
providers listing them, a rule maps a name onto a single-model provider only when both
name the same model, an unknown name is a 404 ``model_not_found`` unless the config has
a catch-all, and whenever another model is sent upstream the response header and the
access log say so."""

from __future__ import annotations

import json
import logging

import anthropic
import httpx
import openai
import pytest
from stack import FAST, gateway, simulators

from latgate.commands.sim import SimOptions

LONG = "word " * 3000  # ~3,000 tokens, over the threshold below


def config(urls: dict[str, str], *, models: dict[str, list[str]], extra: str = "") -> str:
    providers = "".join(
        f'[providers.{name}]\napi_base = "{urls[name]}/v1"\nmodels = {json.dumps(served)}\n\n' for name, served in models.items()
    )
    return f"[defaults]\nmax_retries = 0\n\n{providers}{extra}"


def sims(*names: str):
    return simulators({name: SimOptions(name=name, **FAST) for name in names})


def urls_of(running: dict) -> dict[str, str]:
    return {name: url for name, (url, _) in running.items()}


def ask(url: str, model: str, content: str = "hi", **options):
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    return client.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": content}], max_tokens=2, **options)


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == "latgate.access"]


def test_a_long_prompt_reaches_the_same_model_under_its_served_name_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    models = {"hosted": ["llama-3-8b-instruct"], "local": ["meta-llama/Meta-Llama-3-8B-Instruct"]}
    rules = '[routing]\nlong_context_threshold = 1000\nlong_context_provider = "local"\n'
    with sims("hosted", "local") as running, gateway(config(urls_of(running), models=models, extra=rules)) as gw:
        long = ask(gw.url, "llama-3-8b-instruct", LONG)
        short = ask(gw.url, "llama-3-8b-instruct")
        assert long.parse().model == "llama-3-8b-instruct"  # the body keeps the client's name
        assert (long.headers["x-latgate-provider"], long.headers["x-latgate-upstream-model"]) == ("local", "meta-llama/Meta-Llama-3-8B-Instruct")
        assert running["local"][1].stats.last_request.body["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
        assert short.headers["x-latgate-provider"] == "hosted" and "x-latgate-upstream-model" not in short.headers
    first, second = access_lines(caplog)
    assert (first["model"], first["upstream_model"]) == ("llama-3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct")
    assert second["upstream_model"] == second["model"]


def test_a_long_prompt_and_a_fallback_never_swap_in_the_instruct_model() -> None:
    models = {"a": ["qwen2.5-7b"], "b": ["qwen2.5-7b-instruct"]}
    rules = '[routing]\nlong_context_threshold = 1000\nlong_context_provider = "b"\nfallbacks = { a = ["b"] }\n'
    options = {"a": SimOptions(name="a", error_rate=1.0, **FAST), "b": SimOptions(name="b", **FAST)}
    with simulators(options) as running, gateway(config(urls_of(running), models=models, extra=rules)) as gw:
        with pytest.raises(openai.InternalServerError) as raised:
            ask(gw.url, "qwen2.5-7b", LONG)
        assert raised.value.response.headers["x-latgate-provider"] == "a"
        assert running["b"][1].stats.requests_total == 0


def test_an_exact_name_goes_to_the_provider_listing_it_not_the_default_routes_single_model() -> None:
    models = {"d": ["coder-large"], "c": ["coder"]}
    with sims("d", "c") as running, gateway(config(urls_of(running), models=models, extra='[routing]\ndefault_route = "d"\n')) as gw:
        raw = ask(gw.url, "coder")
        assert (raw.headers["x-latgate-provider"], raw.headers["x-latgate-route-reason"]) == ("c", "model")
        assert running["c"][1].stats.last_request.body["model"] == "coder"


@pytest.mark.parametrize("asked", ["QWEN2.5-7B", "Qwen/Qwen2.5-7B", "gpt-4o"])
def test_an_unknown_name_is_a_404_model_not_found_listing_the_names(asked: str) -> None:
    models = {"d": ["coder-large"], "a": ["qwen2.5-7b"]}
    with sims("d", "a") as running, gateway(config(urls_of(running), models=models, extra='[routing]\ndefault_route = "d"\n')) as gw:
        with pytest.raises(openai.NotFoundError) as raised:
            ask(gw.url, asked)
        error = raised.value.body
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "coder-large, qwen2.5-7b" in error["message"]
        assert running["d"][1].stats.requests_total == running["a"][1].stats.requests_total == 0


def test_a_near_miss_name_gets_a_did_you_mean_in_the_routes_envelope() -> None:
    """``glm-5`` where only ``glm-5.1`` is served: the 404 suggests the close spelling,
    in the OpenAI envelope on chat and in Anthropic's on /v1/messages; a name near
    nothing gets no suggestion. Nothing is sent upstream (the upstream is a dead port)."""
    text = '[providers.p]\napi_base = "http://127.0.0.1:9/v1"\nmodels = ["glm-5.1", "qwen2.5-72b-instruct"]\n'
    with gateway(text) as gw:
        with pytest.raises(openai.NotFoundError) as raised:
            ask(gw.url, "glm-5")
        with pytest.raises(anthropic.NotFoundError) as caught:
            anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0).messages.create(
                model="glm-5", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(openai.NotFoundError) as far:
            ask(gw.url, "claude-sonnet-4-5")
    assert raised.value.body["code"] == "model_not_found"
    assert raised.value.body["message"].startswith("model 'glm-5' is not served here (did you mean 'glm-5.1'?); available models: ")
    assert caught.value.body["error"]["type"] == "not_found_error"
    assert "(did you mean 'glm-5.1'?)" in caught.value.body["error"]["message"]
    assert "did you mean" not in far.value.body["message"]


def test_a_catch_all_alias_serves_any_name_and_is_not_listed_as_a_model() -> None:
    models = {"d": ["coder-large"]}
    with sims("d") as running, gateway(config(urls_of(running), models=models, extra='[aliases]\n"*" = "coder-large"\n')) as gw:
        raw = ask(gw.url, "claude-sonnet-4-5")
        assert raw.parse().model == "claude-sonnet-4-5"
        assert raw.headers["x-latgate-upstream-model"] == "coder-large"
        listed = [m["id"] for m in httpx.get(gw.v1 + "/models").json()["data"]]
        assert listed == ["coder-large"]


def test_a_provider_without_models_and_default_model_still_serve_as_before() -> None:
    with sims("any") as running:
        text = f'[providers.any]\napi_base = "{running["any"][0]}/v1"\n\n[routing]\ndefault_model = "m1"\n'
        with gateway(text) as gw:
            assert ask(gw.url, "whatever-name").headers["x-latgate-provider"] == "any"
            nameless = httpx.post(gw.v1 + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert nameless.status_code == 200 and running["any"][1].stats.last_request.body["model"] == "m1"


def test_the_model_lookup_agrees_with_chat_on_the_catch_all_and_lists_names_otherwise() -> None:
    """``GET /v1/models/{id}`` answers for every name chat would serve, and its 404 is
    chat's: ``model_not_found`` with the available names."""
    models = {"a": ["glm-5.1"]}
    with sims("a") as running:
        with gateway(config(urls_of(running), models=models)) as gw:
            missing = httpx.get(gw.v1 + "/models/claude-x", timeout=10)
            chat = httpx.post(gw.v1 + "/chat/completions", json={"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        assert (missing.status_code, chat.status_code) == (404, 404)
        assert missing.json()["error"]["code"] == "model_not_found"
        assert missing.json()["error"]["message"] == chat.json()["error"]["message"]
        assert "glm-5.1" in missing.json()["error"]["message"]
        with gateway(config(urls_of(running), models=models, extra='[aliases]\n"*" = "glm-5.1"\n')) as gw:
            found = httpx.get(gw.v1 + "/models/claude-x", timeout=10)
        assert found.status_code == 200 and found.json()["id"] == "claude-x"


def test_the_access_line_of_an_unknown_model_names_what_was_asked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    with sims("a") as running, gateway(config(urls_of(running), models={"a": ["glm-5.1"]})) as gw:
        answer = httpx.post(gw.v1 + "/chat/completions", json={"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert answer.status_code == 404
    (line,) = access_lines(caplog)
    assert (line["status"], line["model"]) == (404, "claude-x")
