"""What the session -> endpoint map costs per request, in process and shared over Redis
(``latgate.live.store.sessions``), in one run on this machine.

    .venv/bin/python benchmarks/session_map.py [--sessions 2000] [--turns 20]

Each simulated request does what the strategy does: one ``get`` of its session, then one
``put`` of where it was served. ``--sessions`` sessions take ``--turns`` turns each, in
rounds; a tenth of the turns move their session to the other endpoint (a placement that
changed, so written to Redis). Two shared maps stand for two latgate replicas on one
throw-away ``redis-server``: requests alternate between them, and each replica's poll
runs between rounds. Printed: CPU microseconds per request on the request path (get +
put), CPU per request of the background work (flushes and polls, amortised), and Redis
commands per request (from the server's ``INFO commandstats``). Needs ``redis-server``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from redisd import redis_server

from latgate.live.store.sessions import LocalSessionMap, RedisSessionMap


def keys(count: int) -> list[int]:
    rng = random.Random(1)
    return [rng.getrandbits(64) for _ in range(count)]


def request_path(maps: list, sessions: list[int], turns: int) -> tuple[float, int]:
    """CPU seconds of ``turns`` rounds of get + put (the same loop without the map
    calls subtracted), and the requests made."""
    rng = random.Random(2)
    plan = [
        (maps[(i + turn) % len(maps)], key, "vllm-1" if rng.random() < 0.1 else "vllm-0")
        for turn in range(turns)
        for i, key in enumerate(sessions)
    ]
    started = time.process_time()
    for target, key, endpoint in plan:
        target.get(key)
        target.put(key, endpoint)
    spent = time.process_time() - started
    started = time.process_time()
    for target, key, endpoint in plan:
        pass
    return spent - (time.process_time() - started), len(plan)


async def shared(url: str, sessions: list[int], turns: int) -> dict[str, float]:
    from redis.asyncio import Redis

    replicas = [RedisSessionMap(url=url, timeout_seconds=2) for _ in range(2)]
    admin = Redis.from_url(url)
    await admin.config_resetstat()
    path = background = 0.0
    requests = 0
    for turn in range(turns):
        spent, made = request_path(replicas[turn % 2 :] + replicas[: turn % 2], sessions, 1)
        path, requests = path + spent, requests + made
        started = time.process_time()
        for replica in replicas:
            await replica.flush()
        for replica in replicas:
            await replica.poll()
        background += time.process_time() - started
    stats = await admin.info("commandstats")
    commands = sum(value["calls"] for name, value in stats.items() if name != "cmdstat_config")
    for replica in replicas:
        await replica.aclose()
    await admin.aclose()
    return {
        "path_us": path / requests * 1e6,
        "background_us": background / requests * 1e6,
        "redis_commands_per_request": commands / requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    sessions = keys(args.sessions)
    spent, requests = request_path([LocalSessionMap()], sessions, args.turns)
    print(f"in process: {spent / requests * 1e6:.2f} us CPU per request (get + put), {requests} requests")
    with redis_server() as url:
        result = asyncio.run(shared(url, sessions, args.turns))
    print(
        f"shared (2 replicas, Redis): {result['path_us']:.2f} us CPU per request on the request path, "
        f"{result['background_us']:.2f} us per request in flushes and polls, "
        f"{result['redis_commands_per_request']:.3f} Redis commands per request"
    )


if __name__ == "__main__":
    main()
