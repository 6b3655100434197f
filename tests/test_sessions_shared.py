"""Two latgate replicas sharing ``[state]`` on a real Redis keep a coding-agent session on
one engine whichever replica a turn reaches, and the engine's own report of the prompt
tokens it served from its prefix cache reaches ``/metrics``."""

from __future__ import annotations

import collections

import httpx
import redis
from processes import poll
from redisd import redis_server
from stack import FAST, gateway, simulators

from latgate.commands.sim import SimOptions
from latgate.live.store.sessions import KEY_PREFIX
from latgate.routing.sessions import session_key

CONFIG = """
[providers.pool]
endpoints = ["{a}/v1", "{b}/v1"]
models = ["m"]
[health]
probe_interval_sec = 0
[state]
redis_url = "{redis}"
"""
SYSTEM = "You are a coding agent working in the user's repository. " * 60


def _answered(engine: object) -> int:
    """Requests an engine took and did not fail on purpose (counted as they arrive)."""
    return engine.stats.requests_total - engine.stats.errors_injected


def test_a_sessions_turns_stay_on_one_engine_across_two_latgate_replicas() -> None:
    sims = {name: SimOptions(name=name, models=("m",), prefix_cache=True, **FAST) for name in ("a", "b")}
    with redis_server() as url, simulators(sims) as running:
        config = CONFIG.format(a=running["a"][0], b=running["b"][0], redis=url)
        shared = redis.Redis.from_url(url)
        engine_b = running["b"][1]
        with gateway(config) as first, gateway(config) as second, httpx.Client(timeout=10) as client:
            served: dict[int, list[str]] = collections.defaultdict(list)
            histories = {s: [{"role": "system", "content": SYSTEM}] for s in range(4)}
            # engine b fails every first turn: the first replica places every session on
            # a, where the second, which never saw b fail, would spread new sessions
            # over both (rendezvous hashing) but for the placements in Redis
            for turn in range(4):
                engine_b.set_faults(error_rate=1.0 if turn == 0 else 0.0)
                for session, history in histories.items():
                    headers = {"x-claude-code-session-id": f"s-{session}"}
                    history.append({"role": "user", "content": f"session {session} turn {turn}: " + "read file " * 200})
                    body = {"model": "m", "messages": history, "max_tokens": 4}
                    # turns alternate between the replicas: the odd ones reach the replica
                    # that did not place the session, once the placement is in Redis
                    replica = first if turn % 2 == 0 else second
                    if turn == 1:
                        redis_key = f"{KEY_PREFIX}{session_key(body, headers):016x}"
                        poll(lambda key=redis_key: shared.exists(key), timeout=10.0, what=f"session {session} placed in Redis", interval=0.02)
                    answered = {name: _answered(app) for name, (_, app) in running.items()}
                    response = client.post(replica.v1 + "/chat/completions", json=body, headers=headers)
                    assert response.status_code == 200, response.text
                    history.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
                    served[session].append(next(n for n, (_, app) in running.items() if _answered(app) > answered[n]))
            metrics = client.get(second.url + "/metrics").text
    assert all(places == ["a"] * 4 for places in served.values()), served
    reported = [
        line for line in metrics.splitlines() if line.startswith("latgate_prompt_tokens_cached_total") and 'source="reported"' in line
    ]
    assert reported and float(reported[0].split()[-1]) > 0, reported
