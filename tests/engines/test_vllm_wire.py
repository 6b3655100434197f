"""What a client receives from a real vLLM through latgate, compared with what vLLM
itself sends: the same data lines (ids and timestamps aside), the same token counts,
and vLLM's own client errors passed through as it wrote them."""

from __future__ import annotations

import re
import time

import httpx
import orjson
import pytest
from stack import Stack, gateway
from vllm_server import CONTEXT_TOKENS, SERVED_MODEL, VllmReplica, engine_config

pytestmark = pytest.mark.timeout(300)

_VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


def data_lines(url: str, body: dict) -> list[bytes]:
    """The ``data:`` lines of one streamed answer, ids and timestamps blanked."""
    return [_VOLATILE.sub(rb'"\1":_', line) for line in raw_data_lines(url, body)]


def raw_data_lines(url: str, body: dict) -> list[bytes]:
    """The ``data:`` lines of one streamed answer, as received."""
    with httpx.Client(timeout=120) as client, client.stream("POST", url, json=body) as response:
        assert response.status_code == 200, response.read()
        return [line.encode() for line in response.iter_lines() if line.startswith("data:")]


def chat(**extra: object) -> dict:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": "def main():"}],
        "max_tokens": 12,
        "temperature": 0,
        "seed": 7,
        "stream": True,
        **extra,
    }


def completion(**extra: object) -> dict:
    return {"model": SERVED_MODEL, "prompt": "import asyncio", "max_tokens": 12, "temperature": 0, "stream": True, **extra}


STREAMS = {
    "chat": ("/chat/completions", chat()),
    "chat_usage": ("/chat/completions", chat(stream_options={"include_usage": True})),
    "chat_usage_false": ("/chat/completions", chat(stream_options={"include_usage": False})),
    "chat_continuous_usage": (
        "/chat/completions",
        chat(stream_options={"include_usage": True, "continuous_usage_stats": True}),
    ),
    "chat_n2": ("/chat/completions", chat(n=2, temperature=0.8)),
    "chat_n2_usage": ("/chat/completions", chat(n=2, temperature=0.8, stream_options={"include_usage": True})),
    "completions": ("/completions", completion()),
    "completions_usage": ("/completions", completion(stream_options={"include_usage": True})),
}


@pytest.mark.parametrize("name", list(STREAMS))
def test_stream_data_lines_match_vllm_direct(name: str, stack: Stack, both_ready: list[VllmReplica]) -> None:
    """The same request direct and through latgate (greedy or seeded, so the same
    tokens): every data line's bytes match. vLLM itself decides how many tokens share a
    chunk (more under load) and how n>1 choices interleave, so each choice's lines are
    compared with runs of content-only chunks joined (their text concatenated)."""
    path, body = STREAMS[name]
    direct = data_lines(both_ready[0].url + path, body)
    through = data_lines(stack.v1 + path, body)
    assert direct[-1] == b"data: [DONE]"
    assert by_choice(through) == by_choice(direct)


_TEXT = re.compile(rb'"(content|text)":"((?:[^"\\]|\\.)*)"')


_RUNNING_COUNT = re.compile(rb'"(completion_tokens|total_tokens)":\d+')


def by_choice(lines: list[bytes]) -> dict[bytes, tuple[list[bytes], str]]:
    """Per choice index (``b"-"``: lines of no single choice): its lines with the text
    (and continuous usage's running counts) blanked and consecutive equal ones
    collapsed, and its whole text. The final usage chunk keeps its numbers."""
    out: dict[bytes, tuple[list[bytes], str]] = {}
    for line in lines:
        found = re.search(rb'"choices":\[\{"index":(\d+)', line)
        shapes, text = out.get(found.group(1) if found else b"-", ([], ""))
        for match in _TEXT.finditer(line):
            text += orjson.loads(b'"' + match.group(2) + b'"')
        shape = _TEXT.sub(rb'"\1":_', line)
        if found:  # continuous usage stats: running counts move with the chunking
            shape = _RUNNING_COUNT.sub(rb'"\1":_', shape)
        if not shapes or shapes[-1] != shape:
            shapes.append(shape)
        out[found.group(1) if found else b"-"] = (shapes, text)
    return out


def test_token_counters_equal_vllm_usage(stack: Stack) -> None:
    """latgate's token counters (without the client asking for usage) add up to what
    vLLM reports in usage when asked."""
    before = _counters(stack)
    path, body = STREAMS["chat"]
    data_lines(stack.v1 + path, body)
    direct_usage = _usage_of(raw_data_lines(stack.v1 + path, chat(stream_options={"include_usage": True})))
    after = _counters(stack)
    assert after["prompt"] - before["prompt"] == 2 * direct_usage["prompt_tokens"]
    assert after["completion"] - before["completion"] == 2 * direct_usage["completion_tokens"]


def test_non_streamed_usage_is_counted(stack: Stack) -> None:
    before = _counters(stack)
    answer = httpx.post(stack.v1 + "/chat/completions", json=chat(stream=False), timeout=120)
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    after = _counters(stack)
    assert after["prompt"] - before["prompt"] == usage["prompt_tokens"]
    assert after["completion"] - before["completion"] == usage["completion_tokens"]
    assert int(answer.headers["x-latgate-prompt-tokens"]) > 0


#: a prompt latgate's estimate puts well inside the window (about one token per CJK
#: character) that the test model's byte-level tokenizer, trained on Python source,
#: spends about three tokens a character on: only vLLM can tell it does not fit
DENSE_PROMPT = "漢字仮名" * 150


@pytest.mark.parametrize("stream", [False, True])
def test_context_length_400_passes_through_as_vllm_wrote_it(stream: bool, stack: Stack, both_ready: list[VllmReplica]) -> None:
    """A prompt over vLLM's context answers vLLM's own 400 (JSON, also for streams),
    with the provider named in a header."""
    body = chat(stream=stream, messages=[{"role": "user", "content": DENSE_PROMPT}])
    direct = httpx.post(both_ready[0].url + "/chat/completions", json=body, timeout=60)
    through = httpx.post(stack.v1 + "/chat/completions", json=body, timeout=60)
    assert direct.status_code == 400
    assert through.status_code == 400
    assert through.json() == direct.json()
    assert through.headers["x-latgate-provider"] == "vllm"


def test_a_prompt_over_the_learned_window_is_refused_before_any_upstream_call(
    stack: Stack, both_ready: list[VllmReplica]
) -> None:
    """latgate read ``max_model_len`` from each replica's ``/v1/models``: a prompt it
    estimates over the window gets its own 400 and never reaches vLLM."""
    wait_for_windows(stack)
    prompts = [_counter(r, "vllm:prompt_tokens_total") for r in both_ready]
    body = chat(stream=False, messages=[{"role": "user", "content": "word " * (CONTEXT_TOKENS + 200)}])
    answer = httpx.post(stack.v1 + "/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert "1024" in answer.json()["error"]["message"]
    assert [_counter(r, "vllm:prompt_tokens_total") for r in both_ready] == prompts


def test_max_context_tokens_of_a_model_is_enforced(both_ready: list[VllmReplica]) -> None:
    config = engine_config([both_ready[0].url]) + f'\n[models."{SERVED_MODEL}"]\nmax_context_tokens = 64\n'
    with gateway(config) as stack:
        long = httpx.post(stack.v1 + "/chat/completions", json=chat(stream=False, messages=[{"role": "user", "content": "word " * 200}]), timeout=60)
        short = httpx.post(stack.v1 + "/chat/completions", json=chat(stream=False), timeout=60)
    assert long.status_code == 400
    assert long.json()["error"]["code"] == "context_length_exceeded"
    assert short.status_code == 200


def test_unknown_model_404_passes_through_from_a_provider_without_a_model_list(both_ready: list[VllmReplica]) -> None:
    """A provider that lists no models serves any name: vLLM's own 404 reaches the client."""
    config = engine_config([both_ready[0].url]).replace(f'models = ["{SERVED_MODEL}"]\n', "")
    body = chat(model="no-such-model", stream=False)
    direct = httpx.post(both_ready[0].url + "/chat/completions", json=body, timeout=60)
    assert direct.status_code == 404
    with gateway(config) as stack:
        through = httpx.post(stack.v1 + "/chat/completions", json=body, timeout=60)
    assert through.status_code == 404
    assert through.json() == direct.json()


def test_models_keeps_the_engines_fields(stack: Stack, both_ready: list[VllmReplica]) -> None:
    direct = httpx.get(both_ready[0].url + "/models", timeout=10).json()["data"][0]
    wait_for_windows(stack)
    listed = httpx.get(stack.v1 + "/models", timeout=10)
    assert listed.status_code == 200
    model = next(m for m in listed.json()["data"] if m["id"] == SERVED_MODEL)
    assert model["max_model_len"] == direct["max_model_len"] == CONTEXT_TOKENS
    assert model["created"] == direct["created"]


def wait_for_windows(stack: Stack) -> None:
    """Until latgate's monitor has read the replicas' model lists (it does at start-up)."""
    deadline = time.monotonic() + 30
    while '"max_model_len"' not in httpx.get(stack.v1 + "/models", timeout=10).text:
        assert time.monotonic() < deadline, "latgate never learned the engines' model lists"
        time.sleep(0.1)  # polling latgate's model list, bounded by the deadline


def _counter(replica: VllmReplica, name: str) -> float:
    text = httpx.get(replica.url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _usage_of(lines: list[bytes]) -> dict:
    for line in reversed(lines):
        if b'"usage":{' in line:
            return orjson.loads(line[6:])["usage"]
    raise AssertionError("no usage chunk")


def _counters(stack: Stack) -> dict[str, float]:
    text = httpx.get(stack.url + "/metrics", timeout=10).text
    totals = {"prompt": 0.0, "completion": 0.0}
    for line in text.splitlines():
        for kind in totals:
            if line.startswith(f"latgate_{kind}_tokens_total{{"):
                totals[kind] += float(line.rsplit(" ", 1)[1])
    return totals
