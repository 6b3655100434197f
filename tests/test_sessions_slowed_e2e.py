"""A replica that slows down sheds its sessions, end to end through real ``latgate sim``
servers with a prefix cache (issue 21): the turn after the first one the slowed replica
answered twenty times slower goes to another replica, because the prefill rate that first
token measured prices staying there above the whole history prefilled elsewhere."""

from __future__ import annotations

import dataclasses

import httpx
from stack import gateway, simulators

from latgate.commands.sim import SimOptions

CONFIG = """
[providers.pool]
endpoints = ["{a}/v1", "{b}/v1", "{c}/v1"]
models = ["m"]
[health]
probe_interval_sec = 0
"""
SYSTEM = "You are a coding agent working in the user's repository. " * 60
TIMING = {"tpot_ms": 2.0, "tpot_growth_ms": 0.0, "ttft_overhead_ms": 1.0, "default_max_tokens": 8}
PREFILL_TOKENS_PER_SECOND = 40_000.0
SLOWDOWN = 20.0


def _turn(client: httpx.Client, url: str, session: int, history: list[dict], turn: int) -> str:
    """One turn of ``session``: the endpoint that served it (its name in the debug header)."""
    history.append({"role": "user", "content": f"session {session} turn {turn}: " + "read file " * 1000})
    response = client.post(
        url + "/chat/completions",
        json={"model": "m", "messages": history, "max_tokens": 8, "stream": True},
        headers={"x-claude-code-session-id": f"s-{session}", "x-latgate-debug": "1"},
    )
    assert response.status_code == 200, response.text
    assert "data: [DONE]" in response.text
    history.append({"role": "assistant", "content": f"done {turn}"})
    candidates = response.headers["x-latgate-route-candidates"]
    return next(part.split()[0] for part in candidates.split("; ") if part.endswith(" chosen"))


def test_a_session_leaves_a_replica_that_slowed_down_after_its_first_slow_turn() -> None:
    sims = {
        name: SimOptions(
            name=name, models=("m",), prefix_cache=True, prefill_concurrency=1,
            prefill_tokens_per_second=PREFILL_TOKENS_PER_SECOND, **TIMING,
        )
        for name in ("a", "b", "c")
    }  # fmt: skip
    with (
        simulators(sims) as running,
        gateway(CONFIG.format(**{name: url for name, (url, _) in running.items()})) as gw,
        httpx.Client(timeout=30) as client,
    ):
        histories: dict[int, list[dict]] = {s: [{"role": "system", "content": SYSTEM}] for s in range(3)}
        places: dict[int, list[str]] = {s: [] for s in range(3)}
        for turn in range(4):
            for session in range(3):
                places[session].append(_turn(client, gw.v1, session, histories[session], turn))
        home = places[0][-1]
        assert all(len(set(p[1:])) == 1 for p in places.values()), places
        engine = running["abc"[int(home.rsplit("-", 1)[1])]][1].engine
        engine.options = dataclasses.replace(
            engine.options,
            prefill_tokens_per_second=PREFILL_TOKENS_PER_SECOND / SLOWDOWN,
            tpot_ms=TIMING["tpot_ms"] * SLOWDOWN,
        )
        assert _turn(client, gw.v1, 0, histories[0], 4) == home  # nothing told it yet
        assert _turn(client, gw.v1, 0, histories[0], 5) != home
