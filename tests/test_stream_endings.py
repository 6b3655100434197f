"""How an upstream stream ends, through the gateway, read by httpx and the openai and
anthropic SDKs: a finish reason then a close without ``[DONE]`` gets ``[DONE]``; a close
(or a cut chunked body) before the finish reason is an error event and a failed
request; a provider that refuses ``stream_options`` is asked again without them, once,
and remembered.
"""

from __future__ import annotations

import json
import logging

import anthropic
import httpx
import openai
import pytest
from completions import DONE, ROLE, chat_chunk, content, event
from replay import ReplayScript, replay_server
from stack import gateway, one_upstream_config

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
STOP = event(chat_chunk({}, finish_reason="stop"))
LENGTH = event(chat_chunk({}, finish_reason="length"))
FINISHED = ROLE + content("Hello") + content(" world") + LENGTH
UNFINISHED = ROLE + content("Hello") + content(" world")


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == "latgate.access"]


def requests_total(gw_url: str, code: int) -> str:
    return f'latgate_requests_total{{code="{code}",model="other",provider="up"}} 1.0'


@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_finish_reason_then_close_without_done_gets_done_appended(framing: str) -> None:
    with replay_server(ReplayScript.sse(FINISHED, split_at=[len(ROLE)], framing=framing)) as up, gateway(one_upstream_config(up.base_url)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert r.status_code == 200
        assert r.content == FINISHED + DONE
        assert requests_total(gw.url, 200) in httpx.get(gw.url + "/metrics").text


def test_crlf_stream_finished_without_done_gets_a_crlf_done() -> None:
    body = FINISHED.replace(b"\n", b"\r\n")
    with replay_server(ReplayScript.sse(body)) as up, gateway(one_upstream_config(up.base_url)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert r.content == body + b"data: [DONE]\r\n\r\n"


def test_openai_sdk_reads_a_finished_stream_without_done_to_its_end() -> None:
    with replay_server(ReplayScript.sse(FINISHED)) as up, gateway(one_upstream_config(up.base_url)) as gw:
        client = openai.OpenAI(base_url=gw.v1, api_key="x", max_retries=0)
        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
        assert chunks[-1].choices[0].finish_reason == "length"


def test_a_finished_stream_with_no_content_is_an_answer_not_a_failure() -> None:
    with replay_server(ReplayScript.sse(ROLE + LENGTH)) as up, gateway(one_upstream_config(up.base_url)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert r.status_code == 200
        assert r.content == ROLE + LENGTH + DONE
        assert len(up.requests) == 1


@pytest.mark.parametrize(
    ("framing", "end"), [("close", "complete"), ("chunked", "complete"), ("chunked", "drop")], ids=["close", "chunked-whole", "chunked-cut"]
)
def test_close_before_the_finish_reason_is_an_error_event_and_a_failed_request(
    framing: str, end: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="latgate.access")
    script = ReplayScript.sse(UNFINISHED, split_at=[len(ROLE)], framing=framing, end=end)
    with replay_server(script) as up, gateway(one_upstream_config(up.base_url)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert r.status_code == 200  # the head went out with the first content
        assert r.content.startswith(UNFINISHED)
        tail = r.content[len(UNFINISHED) :]
        assert b"[DONE]" not in tail
        assert json.loads(tail.removeprefix(b"data: "))["error"]["type"] == "api_error"
        metrics = httpx.get(gw.url + "/metrics").text
        assert requests_total(gw.url, 502) in metrics
        assert 'latgate_upstream_errors_total{kind="stream_' in metrics
    (line,) = access_lines(caplog)
    assert line["status"] == 502 and line["error"].startswith("stream_")


def test_one_of_two_choices_left_open_is_an_unfinished_stream() -> None:
    two = event(chat_chunk({"content": "B"}, index=1))
    body = ROLE + content("A") + two + STOP
    with replay_server(ReplayScript.sse(body)) as up, gateway(one_upstream_config(up.base_url)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json={**BODY, "n": 2}, timeout=10)
        assert b"[DONE]" not in r.content
        assert b'"error"' in r.content[len(body) :]


def test_openai_sdk_raises_on_a_stream_closed_before_its_finish_reason() -> None:
    with replay_server(ReplayScript.sse(UNFINISHED, framing="close")) as up, gateway(one_upstream_config(up.base_url)) as gw:
        client = openai.OpenAI(base_url=gw.v1, api_key="x", max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
        with pytest.raises(openai.APIError, match="finish reason"):
            list(stream)


def test_anthropic_sdk_gets_message_stop_after_a_finish_and_an_error_without_one() -> None:
    request = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    scripts = [ReplayScript.sse(FINISHED), ReplayScript.sse(UNFINISHED, framing="close")]
    with replay_server(scripts) as up, gateway(one_upstream_config(up.base_url)) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
        with client.messages.stream(**request) as stream:
            text = "".join(stream.text_stream)
            message = stream.get_final_message()
        assert text == "Hello world" and message.stop_reason == "max_tokens"
        with pytest.raises(anthropic.APIError), client.messages.stream(**request) as stream:
            "".join(stream.text_stream)


REJECTED = ReplayScript.json_response(
    400, {"error": {"message": "Unrecognized request argument supplied: stream_options", "type": "invalid_request_error", "param": None, "code": None}}
)


def test_provider_rejecting_stream_options_is_asked_again_without_them_and_remembered() -> None:
    ok = ReplayScript.sse(FINISHED + DONE)
    with replay_server([REJECTED, ok, ok]) as up, gateway(one_upstream_config(up.base_url)) as gw:
        first = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert first.status_code == 200 and first.content == FINISHED + DONE
        second = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert second.status_code == 200
        sent = [r.json() for r in up.requests]
        assert len(sent) == 3
        assert sent[0]["stream_options"] == {"include_usage": True}
        assert "stream_options" not in sent[1] and "stream_options" not in sent[2]
        metrics = httpx.get(gw.url + "/metrics").text
        # usage from latgate's own count: two content chunks per stream
        assert 'latgate_completion_tokens_total{model="other",outcome="ok",provider="up"} 4.0' in metrics
        assert 'latgate_requests_total{code="200",model="other",provider="up"} 2.0' in metrics


def test_a_second_400_after_dropping_stream_options_is_the_clients_answer() -> None:
    with replay_server([REJECTED, REJECTED]) as up, gateway(one_upstream_config(up.base_url)) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", json=BODY, timeout=10)
        assert r.status_code == 400
        assert len(up.requests) == 2
