"""Context windows: ``[models.X] max_context_tokens`` and each endpoint's window as its
engine reports it (``max_model_len`` in ``/v1/models``): a prompt that cannot fit an
endpoint is never sent there, and when none fits latgate answers 400
``context_length_exceeded`` before any upstream call."""

from __future__ import annotations

import httpx
import orjson
from completions import chat_completion
from replay import ReplayScript, replay_server
from stack import gateway

from latgate.live.providers.catalog import context_tokens, fits, parse_catalog, public_model_object

VLLM_MODELS = {
    "object": "list",
    "data": [
        {"id": "tiny", "object": "model", "created": 1796112720, "owned_by": "vllm", "root": "/models/tiny",
         "parent": None, "max_model_len": 1024, "permission": []},
    ],
}  # fmt: skip
LONG = {"model": "tiny", "messages": [{"role": "user", "content": "word " * 1200}]}
SHORT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def test_the_window_is_read_from_vllms_model_list() -> None:
    catalog = parse_catalog(orjson.dumps(VLLM_MODELS))
    assert context_tokens(catalog, "tiny") == 1024
    assert context_tokens(catalog, "other") is None
    assert fits(catalog, "tiny", 1023) and not fits(catalog, "tiny", 1024)
    assert fits(None, "tiny", 10**6)  # nothing known: nothing refused
    assert parse_catalog(b"<html>") is None and parse_catalog(b'{"data": 3}') is None


def test_the_engines_model_object_is_passed_on_under_the_public_name_without_its_path() -> None:
    catalog = parse_catalog(orjson.dumps(VLLM_MODELS))
    shown = public_model_object("public", ["public", "tiny"], [catalog])
    assert shown["id"] == "public"
    assert shown["max_model_len"] == 1024 and shown["created"] == 1796112720
    assert "root" not in shown
    assert public_model_object("x", ["x"], [catalog]) == {"id": "x", "object": "model", "created": 0, "owned_by": "latgate"}


def two_endpoint_config(small: str, large: str) -> str:
    return f"""
[defaults]
max_retries = 1
[providers.vllm]
endpoints = ["{small}", "{large}"]
models = ["tiny"]
[health]
probe_interval_sec = 0
load_interval_sec = 0
"""


def set_window(stack, index: int, window: int) -> None:
    endpoint = stack.app.state.gateway.pool["vllm"].endpoints[index]
    endpoint.catalog = {"tiny": {"id": "tiny", "object": "model", "max_model_len": window}}


def test_a_prompt_goes_only_to_the_endpoint_whose_window_fits() -> None:
    answer = ReplayScript.json_response(200, chat_completion())
    with replay_server([answer] * 4) as small, replay_server([answer] * 4) as large:
        with gateway(two_endpoint_config(small.base_url, large.base_url)) as stack:
            set_window(stack, 0, 512)
            set_window(stack, 1, 4096)
            for _ in range(3):
                assert httpx.post(stack.v1 + "/chat/completions", json=LONG, timeout=10).status_code == 200
        assert len(small.requests) == 0
        assert len(large.requests) == 3


def test_no_endpoint_fits_a_400_before_any_upstream_call() -> None:
    answer = ReplayScript.json_response(200, chat_completion())
    with replay_server([answer]) as one, replay_server([answer]) as two:
        with gateway(two_endpoint_config(one.base_url, two.base_url)) as stack:
            set_window(stack, 0, 512)
            set_window(stack, 1, 1024)
            refused = httpx.post(stack.v1 + "/chat/completions", json={**LONG, "stream": True}, timeout=10)
            listed = httpx.get(stack.v1 + "/models", timeout=10).json()["data"]
        assert len(one.requests) + len(two.requests) == 0
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "vllm: 512 tokens" in error["message"]
    assert listed == [{"id": "tiny", "object": "model", "max_model_len": 512}]


def test_max_context_tokens_is_enforced_before_any_upstream_call() -> None:
    config = """
[providers.up]
api_base = "{base}"
[models."tiny"]
max_context_tokens = 100
"""
    with replay_server([ReplayScript.json_response(200, chat_completion())]) as upstream:
        with gateway(config.format(base=upstream.base_url)) as stack:
            refused = httpx.post(stack.v1 + "/chat/completions", json=LONG, timeout=10)
            served = httpx.post(stack.v1 + "/chat/completions", json=SHORT, timeout=10)
        assert len(upstream.requests) == 1
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert served.status_code == 200
