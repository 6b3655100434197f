"""Agent sessions end to end through real ``latgate sim`` servers with a prefix cache:
each session's turns land on one endpoint, the explanation shows the prefix each
candidate is believed to hold, and /admin/providers and /metrics count it."""

from __future__ import annotations

import collections

import httpx
from stack import FAST, gateway, simulators

from latgate.commands.sim import SimOptions

CONFIG = """
[providers.pool]
endpoints = ["{a}/v1", "{b}/v1"]
models = ["m"]
[health]
probe_interval_sec = 0
"""
SYSTEM = "You are a coding agent working in the user's repository. " * 60


def test_sessions_with_headers_keep_their_endpoint_and_are_explained() -> None:
    sims = {name: SimOptions(name=name, models=("m",), prefix_cache=True, **FAST) for name in ("a", "b")}
    with simulators(sims) as running, gateway(CONFIG.format(a=running["a"][0], b=running["b"][0])) as gw:
        chosen: dict[int, list[str]] = collections.defaultdict(list)
        last_candidates = ""
        with httpx.Client(timeout=10) as client:
            histories: dict[int, list[dict]] = {s: [{"role": "system", "content": SYSTEM}] for s in range(4)}
            for turn in range(5):
                for session in range(4):
                    history = histories[session]
                    history.append({"role": "user", "content": f"session {session} turn {turn}: " + "read file " * 200})
                    response = client.post(
                        gw.v1 + "/chat/completions",
                        json={"model": "m", "messages": history, "max_tokens": 4},
                        headers={"x-claude-code-session-id": f"s-{session}", "x-latgate-debug": "1"},
                    )
                    assert response.status_code == 200, response.text
                    history.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
                    last_candidates = response.headers["x-latgate-route-candidates"]
                    chosen[session].append(next(p.split()[0] for p in last_candidates.split("; ") if p.endswith(" chosen")))
            assert all(len(set(places[1:])) == 1 for places in chosen.values()), chosen
            assert " cached " in last_candidates and " prefill " in last_candidates
            endpoints = client.get(gw.url + "/admin/providers").json()["providers"]["pool"]["endpoints"]
            assert sum(ep["prefix_index"]["entries"] for ep in endpoints) > 0
            metrics = client.get(gw.url + "/metrics").text
        predicted = [line for line in metrics.splitlines() if line.startswith("latgate_prompt_tokens_cached_total") and 'source="predicted"' in line]
        assert predicted and float(predicted[0].split()[-1]) > 0, predicted


def test_malformed_messages_on_a_caching_pool_are_the_clients_400_never_a_500() -> None:
    sims = {name: SimOptions(name=name, models=("m",), prefix_cache=True, **FAST) for name in ("a", "b")}
    deep: object = "x"
    for _ in range(300):
        deep = [deep]
    with (
        simulators(sims) as running,
        gateway(CONFIG.format(a=running["a"][0], b=running["b"][0])) as gw,
        httpx.Client(timeout=10) as client,
    ):
        nested = client.post(
            gw.v1 + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": deep}, {"role": "user", "content": "x"}]},
        )
        odd_role = client.post(
            gw.v1 + "/chat/completions",
            json={"model": "m", "messages": [{"role": ["user"], "content": "hi"}, {"role": "user", "content": "x"}]},
        )
    assert nested.status_code == 400 and nested.json()["error"]["code"] == "nesting_too_deep", nested.text
    assert odd_role.status_code != 500, odd_role.text


def test_reported_cached_tokens_correct_the_index_and_show_beside_its_prediction() -> None:
    # engines that hold far less than latgate is told (prefix_cache_tokens): their usage reports fewer
    # cached tokens than the index predicts, and the index learns to believe less
    sims = {
        name: SimOptions(name=name, models=("m",), prefix_cache=True, prefix_cache_tokens=1_500, **FAST) for name in ("a", "b")
    }
    with (
        simulators(sims) as running,
        gateway(CONFIG.format(a=running["a"][0], b=running["b"][0])) as gw,
        httpx.Client(timeout=10) as client,
    ):
        histories: dict[int, list[dict]] = {s: [{"role": "system", "content": SYSTEM}] for s in range(4)}
        for turn in range(4):
            for session in range(4):
                history = histories[session]
                history.append({"role": "user", "content": f"session {session} turn {turn}: " + "read file " * 200})
                response = client.post(
                    gw.v1 + "/chat/completions",
                    json={"model": "m", "messages": history, "max_tokens": 4, "stream": turn % 2 == 1},
                    headers={"x-claude-code-session-id": f"s-{session}"},
                )
                assert response.status_code == 200, response.text
                history.append({"role": "assistant", "content": "ok"})
        endpoints = client.get(gw.url + "/admin/providers").json()["providers"]["pool"]["endpoints"]
        ui_endpoints = client.get(gw.url + "/ui/state").json()["providers"]["pool"]["endpoints"]
        metrics = client.get(gw.url + "/metrics").text
    hits = [ep["cache_hits"] for ep in endpoints]
    assert sum(h["reports"] for h in hits) == 16 and sum(h["misses"] for h in hits) > 0, hits
    assert sum(h["reported_tokens"] for h in hits) < sum(h["predicted_tokens"] for h in hits), hits
    assert all(h["predicted_ratio"] is not None and h["reported_ratio"] is not None for h in hits if h["reports"])
    shrunk = [ep["prefix_index"] for ep in endpoints if ep["cache_hits"]["misses"]]
    assert shrunk and all(i["effective_capacity_tokens"] < i["capacity_tokens"] for i in shrunk), shrunk
    assert [ep["cache_hits"] for ep in ui_endpoints] == hits
    cached = {
        source: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("latgate_prompt_tokens_cached_total")
        for source in ("predicted", "reported")
        if f'source="{source}"' in line
    }
    assert 0 < cached["reported"] < cached["predicted"], cached
