"""Coding-agent sessions against two real vLLM replicas with prefix caching: the turns
of one session land on one replica, and vLLM's own ``cached_tokens`` says their history
was served from its cache.

The replicas serve the engine tier's long-context model (8192 positions, see
``build_model.py``) with ``--enable-prefix-caching --enable-prompt-tokens-details``, and
are started for this module only (it runs first, before the tier's shared replicas, so
two vLLM servers at most run at once). Three sessions of three turns each share one
system prompt (~700 tokens, of which vLLM caches whole 128-token blocks); each turn
resends the session's history plus a new user message (~210 tokens), with the
session's ``x-claude-code-session-id``. latgate runs its default config (strategy
``latgate``, no routing keys set), then ``round_robin``, on the same replicas (each run
with its own system prompt, so neither finds the other's prefixes cached). The turns are sent one at a time, interleaved
across sessions (1/1, 2/1, 3/1, 1/2, ...), so the result depends on where they were
routed and not on timing: with three sessions and two replicas, ``round_robin`` moves
every session to the other replica on each turn.

Where a turn landed is read from the replicas themselves (``vllm:request_success_total``
grew there). TTFT per turn is measured and written to
``build/artifacts/vllm_prefix_cache.json`` for the comparison in
``docs/performance.md``; it is not asserted.
"""

from __future__ import annotations

import itertools
import json
import random
import time
import uuid
from pathlib import Path

import httpx
import orjson
import pytest
from stack import gateway
from vllm_server import SERVED_MODEL, VllmReplica, engine_config

from latgate.live.providers.engine_cache import parse_vllm_cache

pytestmark = [pytest.mark.timeout(420), pytest.mark.own_replicas]

SESSIONS = 3
TURNS = 3
SYSTEM_WORDS = 500
TURN_WORDS = 200
MAX_TOKENS = 4
ARTIFACT = Path(__file__).resolve().parents[2] / "build" / "artifacts" / "vllm_prefix_cache.json"
#: words the tokenizer (trained on asyncio's sources) knows, to build prompts from
WORDS = [
    *("async", "def", "await", "return", "self", "loop", "future", "task", "event", "queue", "transport"),
    *("protocol", "callback", "handle", "result", "exception", "cancel", "timeout", "sleep", "gather"),
    *("wait", "stream", "reader", "writer", "server", "connection", "socket", "buffer", "data", "close"),
]


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def served_requests(replica: VllmReplica) -> float:
    """``vllm:request_success_total`` of one replica (every finish reason)."""
    text = metrics_page(replica)
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def landed(replicas: list[VllmReplica], before: list[float]) -> list[int]:
    """The replicas whose served count grew since ``before``, once one has (vLLM counts
    a request as it finishes; the poll is bounded)."""
    deadline = time.monotonic() + 30
    while True:
        grew = [i for i, replica in enumerate(replicas) if served_requests(replica) > before[i]]
        if grew or time.monotonic() > deadline:
            return grew
        time.sleep(0.05)  # polling the engines' counters, bounded by the deadline


def metrics_page(replica: VllmReplica) -> str:
    return httpx.get(replica.url.removesuffix("/v1") + "/metrics", timeout=10).text


def streamed_turn(client: httpx.Client, url: str, messages: list[dict], session: str) -> dict:
    """One streamed turn: its answer text, usage and TTFT (ms to the first content)."""
    body = {
        "model": SERVED_MODEL,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft_ms = None
    text, usage = [], None
    with client.stream("POST", url, json=body, headers={"x-claude-code-session-id": session}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if ttft_ms is None:
                        ttft_ms = (time.perf_counter() - started) * 1000.0
                    text.append(content)
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert usage is not None, "no usage chunk"
    return {"text": "".join(text), "usage": usage, "ttft_ms": ttft_ms}


def run_sessions(replicas: list[VllmReplica], *, strategy: str, salt: str) -> tuple[list[dict], list[dict]]:
    """The sessions through a latgate with ``strategy``; one record per turn: session,
    turn, replica index, prompt and cached tokens, TTFT; and each endpoint's
    ``cache_hits`` in ``/admin/providers`` afterwards. ``salt`` starts the system
    prompt, so no other run's prefixes are in the replicas' caches."""
    rng = random.Random(salt)
    system = f"{salt} " + words(rng, SYSTEM_WORDS)
    histories = [[{"role": "system", "content": system}] for _ in range(SESSIONS)]
    ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(SESSIONS)]
    config = engine_config([replica.url for replica in replicas]) + f'\n[routing]\nstrategy = "{strategy}"\n'
    records = []
    with gateway(config) as stack, httpx.Client(timeout=180) as client:
        for turn in range(1, TURNS + 1):
            for session in range(SESSIONS):
                history = histories[session]
                history.append({"role": "user", "content": words(rng, TURN_WORDS)})
                before = [served_requests(replica) for replica in replicas]
                answer = streamed_turn(client, stack.v1 + "/chat/completions", history, ids[session])
                grew = landed(replicas, before)
                assert len(grew) == 1, f"turn {turn} of session {session}: served by replicas {grew}"
                history.append({"role": "assistant", "content": answer["text"]})
                details = answer["usage"].get("prompt_tokens_details") or {}
                records.append(
                    record := {
                        "strategy": strategy,
                        "session": session,
                        "turn": turn,
                        "replica": grew[0],
                        "prompt_tokens": answer["usage"]["prompt_tokens"],
                        "cached_tokens": details.get("cached_tokens") or 0,
                        "ttft_ms": None if answer["ttft_ms"] is None else round(answer["ttft_ms"], 1),
                    }
                )
                print(record, flush=True)
        endpoints = client.get(stack.url + "/admin/providers").json()["providers"]["vllm"]["endpoints"]
    return records, [endpoint["cache_hits"] for endpoint in endpoints]


def test_a_sessions_turns_stay_on_one_replica_and_vllm_serves_their_history_from_its_cache(
    cache_replicas: list[VllmReplica],
) -> None:
    facts = parse_vllm_cache(metrics_page(cache_replicas[0]))
    assert facts is not None and facts.prefix_caching, "vLLM reports prefix caching off"
    block = facts.block_size_tokens or 1
    default, hits = run_sessions(cache_replicas, strategy="latgate", salt="default")
    round_robin, _ = run_sessions(cache_replicas, strategy="round_robin", salt="round-robin")
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    engine = {"block_size_tokens": block, "capacity_tokens": facts.capacity_tokens}
    ARTIFACT.write_text(json.dumps({"engine": engine, "turns": default + round_robin, "cache_hits": hits}, indent=1))
    # latgate counted what vLLM reported, beside what its prefix index predicted
    assert sum(h["reported_tokens"] for h in hits) == sum(r["cached_tokens"] for r in default), hits
    assert sum(h["predicted_tokens"] for h in hits) > 0 and sum(h["reports"] for h in hits) > 0, hits
    for session in range(SESSIONS):
        turns = [r for r in default if r["session"] == session]
        assert len({r["replica"] for r in turns}) == 1, f"session {session} moved: {turns}"
        for previous, later in itertools.pairwise(turns):
            # the earlier turn's prompt is a prefix of this one: vLLM holds its whole blocks
            expected = previous["prompt_tokens"] // block * block
            assert later["cached_tokens"] >= expected, f"session {session}: {previous} then {later}"
