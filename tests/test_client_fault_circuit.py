"""A client's own mistake answered by a provider whose circuit is open says nothing of
the circuit: the request failed for what it asked, not because the provider is out of
service. Through a real gateway, a replayed upstream and the anthropic / openai SDKs."""

from __future__ import annotations

import logging

import anthropic
import httpx
import openai
import pytest
from replay import ReplayScript, replay_server
from stack import gateway

CONFIG = '[defaults]\nmax_retries = 0\n[providers.p]\napi_base = "{url}"\n[health]\nprobe_interval_sec = 0\n'
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
DOWN = ReplayScript.json_response(503, {"error": {"message": "overloaded"}})
CLIENT_FAULT = ReplayScript.json_response(
    400, {"error": {"message": "max_tokens is more than this model's context", "type": "BadRequestError"}}
)


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/chat/completions"])
def test_a_client_fault_400_while_the_circuit_is_open_carries_no_circuit_text(route: str, caplog) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    with replay_server([DOWN] * 5 + [CLIENT_FAULT]) as upstream, gateway(CONFIG.format(url=upstream.base_url)) as gw:
        for _ in range(5):
            assert httpx.post(gw.v1 + "/chat/completions", json=CHAT).status_code == 503
        view = httpx.get(gw.url + "/admin/providers").json()["providers"]["p"]["endpoints"][0]
        assert view["circuit"] == "open"
        caplog.clear()
        if route == "/v1/messages":
            client = anthropic.Anthropic(base_url=gw.url, api_key="sk-test", max_retries=0)
            with pytest.raises(anthropic.BadRequestError) as refused:
                client.messages.create(model="m", max_tokens=64, messages=CHAT["messages"])
            message = refused.value.response.json()["error"]["message"]
        else:
            sdk = openai.OpenAI(base_url=gw.v1, api_key="sk-test", max_retries=0)
            with pytest.raises(openai.BadRequestError) as refused:
                sdk.chat.completions.create(**CHAT)
            message = refused.value.response.json()["error"]["message"]
    assert "max_tokens is more than this model's context" in message, message
    assert "circuit" not in message and "out of service" not in message, message
    assert "circuit open" not in caplog.text and "out of service" not in caplog.text, caplog.text
