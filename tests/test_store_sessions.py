"""Session placements (session key -> endpoint id): the in-process map is bounded and
ages out; the Redis one is seen by every replica on the same Redis and never fails a
caller when Redis is gone."""

from __future__ import annotations

import asyncio
import gc
import weakref

from clocks import ManualClock
from redis.asyncio import Redis
from redisd import free_port, redis_server

from latgate.foundation.config.schema import StateConfig
from latgate.live.store.sessions import (
    LOG_KEY,
    LocalSessionMap,
    RedisSessionMap,
    SessionMaps,
    open_session_map,
)


def test_the_local_map_forgets_the_least_recently_used_beyond_its_bound() -> None:
    sessions = LocalSessionMap(max_sessions=3)
    for key in range(3):
        sessions.put(key, f"vllm-{key}")
    assert sessions.get(0) == "vllm-0"  # now the most recently used
    sessions.put(3, "vllm-3")
    assert len(sessions) == 3
    assert sessions.get(1) is None
    assert [sessions.get(key) for key in (0, 2, 3)] == ["vllm-0", "vllm-2", "vllm-3"]


def test_a_placement_expires_its_ttl_after_its_last_use() -> None:
    clock = ManualClock()
    sessions = LocalSessionMap(ttl_seconds=60, clock=clock)
    sessions.put(7, "vllm-0")
    clock.now += 50
    assert sessions.get(7) == "vllm-0"  # used: its TTL starts again
    clock.now += 50
    assert sessions.get(7) == "vllm-0"
    clock.now += 61
    assert sessions.get(7) is None
    assert len(sessions) == 0
    sessions.put(7, "vllm-1")
    assert sessions.get(7) == "vllm-1"


def test_two_replicas_on_one_redis_see_each_others_placements(flushed) -> None:
    async def scenario() -> None:
        first = RedisSessionMap(url=flushed, timeout_seconds=2)
        second = RedisSessionMap(url=flushed, timeout_seconds=2)
        try:
            first.put(1, "vllm-0")
            first.put(2, "vllm-1")
            await first.flush()
            assert second.get(1) is None  # not polled yet: nothing local
            assert await second.poll() == 2
            assert (second.get(1), second.get(2)) == ("vllm-0", "vllm-1")
            second.put(1, "vllm-1")  # the session moved on the other replica
            await second.flush()
            assert await first.poll() == 1  # its own entry is not taken again
            assert first.get(1) == "vllm-1"
            assert await second.poll() == 0
        finally:
            await first.aclose()
            await second.aclose()

    asyncio.run(scenario())


def test_a_miss_is_read_through_for_the_next_turn(flushed) -> None:
    """A replica started after the placement's log entry was trimmed (log of one entry)
    answers its miss at once and reads the key with the next flush."""

    async def scenario() -> None:
        first = RedisSessionMap(url=flushed, timeout_seconds=2, log_entries=1)
        late = RedisSessionMap(url=flushed, timeout_seconds=2)
        try:
            first.put(5, "vllm-0")
            await first.flush()
            first.put(6, "vllm-1")
            await first.flush()
            assert await late.poll() == 1  # only the last batch is left in the log
            assert late.get(5) is None
            await late.flush()
            assert late.get(5) == "vllm-0"
        finally:
            await first.aclose()
            await late.aclose()

    asyncio.run(scenario())


def test_writes_are_batched_behind_and_expire_in_redis(flushed) -> None:
    async def scenario() -> None:
        sessions = RedisSessionMap(url=flushed, timeout_seconds=2, ttl_seconds=30)
        client = Redis.from_url(flushed)
        try:
            for key in range(50):
                sessions.put(key, "vllm-0")
            await sessions.flush()
            assert await client.xlen(LOG_KEY) == 1  # fifty placements, one write
            ttl_ms = await client.pttl(b"latgate:{sessions}:%016x" % 3)
            assert 0 < ttl_ms <= 30_000
            sessions.put(0, "vllm-0")  # unchanged and just written: not written again
            await sessions.flush()
            assert await client.xlen(LOG_KEY) == 1
            sessions.put(0, "vllm-1")  # moved: written
            await sessions.flush()
            assert await client.xlen(LOG_KEY) == 2
            assert await client.get(b"latgate:{sessions}:%016x" % 0) == b"vllm-1"
        finally:
            await sessions.aclose()
            await client.aclose()

    asyncio.run(scenario())


def test_memory_stays_bounded_locally_and_in_redis(flushed) -> None:
    async def scenario() -> None:
        sessions = RedisSessionMap(url=flushed, timeout_seconds=2, max_sessions=100, log_entries=20)
        reader = RedisSessionMap(url=flushed, timeout_seconds=2, max_sessions=100)
        client = Redis.from_url(flushed)
        try:
            for batch in range(40):
                for key in range(batch * 100, batch * 100 + 100):
                    sessions.put(key, "vllm-1")
                await sessions.flush()
            for key in range(10_000):
                assert sessions.get(key + 100_000) is None  # misses queue a bounded number of reads
            await sessions.flush()
            await reader.poll()
            assert len(sessions) <= 100 and len(reader) <= 100
            assert await client.xlen(LOG_KEY) <= 20
        finally:
            await sessions.aclose()
            await reader.aclose()
            await client.aclose()

    asyncio.run(scenario())


def test_with_redis_down_placements_are_kept_in_process_and_nothing_raises(caplog) -> None:
    async def scenario() -> None:
        with redis_server() as url:
            sessions = RedisSessionMap(url=url, timeout_seconds=1)
            sessions.put(1, "vllm-0")
            await sessions.flush()
            assert sessions.reachable
        # the server is gone
        sessions.put(2, "vllm-1")
        await sessions.flush()
        assert await sessions.poll() == 0
        assert not sessions.reachable
        assert (sessions.get(1), sessions.get(2), sessions.get(3)) == ("vllm-0", "vllm-1", None)
        await sessions.aclose()
        never = RedisSessionMap(url=f"redis://127.0.0.1:{free_port()}/0", timeout_seconds=1)
        never.put(9, "vllm-0")
        await never.flush()
        assert never.get(9) == "vllm-0"
        await never.aclose()

    asyncio.run(scenario())
    assert "session placements: the shared store (Redis) is unreachable (cannot connect: connection refused)" in caplog.text
    assert "127.0.0.1" not in caplog.text


def test_state_decides_which_map() -> None:
    assert type(open_session_map(StateConfig())) is LocalSessionMap
    shared = open_session_map(StateConfig(redis_url="redis://127.0.0.1:1/0", redis_timeout_ms=50))
    assert isinstance(shared, RedisSessionMap)


def test_a_reload_to_another_state_writes_the_retired_shared_map_and_keeps_neither(flushed) -> None:
    async def scenario() -> None:
        maps = SessionMaps()
        shared = maps.map_for(StateConfig(redis_url=flushed))
        shared.put(7, "ep-a")  # queued behind, not yet in Redis
        retired = weakref.ref(shared)
        del shared
        local = maps.map_for(StateConfig())
        retired_local = weakref.ref(local)
        del local
        maps.map_for(StateConfig(redis_url=flushed, redis_timeout_ms=200))
        await maps.closed()
        gc.collect()
        assert retired() is None and retired_local() is None, "a retired map is still kept"
        reader = RedisSessionMap(url=flushed, timeout_seconds=2)
        try:
            assert reader.get(7) is None  # a miss: read with the next flush
            await reader.flush()
            assert reader.get(7) == "ep-a", "the retired map's queued write was lost"
        finally:
            await reader.aclose()
        await maps.aclose()

    asyncio.run(scenario())
