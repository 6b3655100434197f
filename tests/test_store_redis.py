"""Shared state on a real Redis: limits hold across replicas, one replica's ejection of
an endpoint is seen by the others, and an unreachable Redis never hangs a caller."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path

import httpx
import pytest
from apis import post_head, read_answer
from clocks import ManualClock
from completions import CHAT_BODY, chat_completion, proxied_posts, stream_with_usage
from processes import poll
from redis.asyncio import Redis
from redisd import free_port, redis_server
from replay import ReplayScript, replay_server
from servers import listening_socket
from stack import gateway, gateway_file

from latgate.api.routes import APIS as ROUTES
from latgate.foundation.config import load_config_text
from latgate.foundation.metrics import Metrics
from latgate.live.store import MemoryStore, Quota, RedisStore, StoreUnavailable
from latgate.request.gateway import Gateway
from latgate.transport.upstream import UpstreamClient

COMPLETION = chat_completion()
KEY = {"Authorization": "Bearer sk-a"}


def config_text(base: str, redis: str, *, rpm: int = 3, endpoints: int = 1) -> str:
    addresses = ", ".join(f'"{base}/r{i}"' for i in range(endpoints))
    return (
        f"[providers.up]\nendpoints = [{addresses}]\n\n"
        f'[state]\nredis_url = "{redis}"\n\n'
        f'[[auth.keys]]\nname = "team-a"\nkey = "sk-a"\nrpm = {rpm}\n'
    )


def test_rpm_holds_across_two_replicas_sharing_redis(flushed) -> None:
    with replay_server(ReplayScript.json_response(200, COMPLETION)) as upstream:
        text = config_text(upstream.base_url, flushed, rpm=3)
        with gateway(text) as one, gateway(text) as two:
            codes = [
                httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY).status_code
                for gw in (one, two, one, two, one)
            ]
    assert codes == [200, 200, 200, 429, 429]
    assert proxied_posts(upstream) == 3


def script_calls(url: str) -> int:
    """Script calls (EVALSHA, EVAL) the Redis at ``url`` has run."""

    async def read() -> int:
        client = Redis.from_url(url)
        stats = await client.info("commandstats")
        await client.aclose()
        return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))

    return asyncio.run(read())


def test_each_limited_request_is_one_script_call(flushed) -> None:
    with (
        replay_server(ReplayScript.json_response(200, COMPLETION)) as upstream,
        gateway(config_text(upstream.base_url, flushed, rpm=100)) as gw,
    ):
        before = script_calls(flushed)
        codes = [httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY).status_code for _ in range(5)]
        assert codes == [200] * 5
        assert script_calls(flushed) - before == 5  # the RPM alone: no TPM correction to flush


def test_a_replica_refused_by_redis_refuses_that_key_before_its_body_is_read(flushed) -> None:
    with replay_server(ReplayScript.json_response(200, COMPLETION)) as upstream:
        text = config_text(upstream.base_url, flushed, rpm=1)
        with gateway(text) as one, gateway(text) as two:
            assert httpx.post(one.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY).status_code == 200
            # two has charged nothing yet: Redis refuses it once its body is read ...
            assert httpx.post(two.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY).status_code == 429
            # ... and from then on two refuses the key before reading a body
            chat = next(api for api in ROUTES if api.name == "/chat/completions")
            with socket.create_connection(("127.0.0.1", int(two.url.rsplit(":", 1)[1]))) as conn:
                # 30 MB announced, a few bytes sent: answered at once, not after the body
                head = post_head(chat, content_length=30_000_000, headers=b"Authorization: Bearer sk-a\r\n")
                conn.sendall(head + b'{"model": "m", "messages": [')
                status_line, body = read_answer(conn)
            assert status_line.startswith(b"HTTP/1.1 429 ")
            assert body["error"]["type"] == "rate_limit_error"
        assert proxied_posts(upstream) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_tpm_in_redis_is_corrected_from_the_reported_usage(flushed, stream: bool) -> None:
    # As in process (test_limits): each answer reports 100 tokens against an estimate of
    # ~10 (max_tokens 1), so with a TPM of 150 the third request is refused; the
    # corrections ride on the next charges' script calls, the debt bounded (full: 4 s).
    script = (
        ReplayScript.sse(stream_with_usage(5, 95))
        if stream
        else ReplayScript.json_response(200, chat_completion(prompt_tokens=5, completion_tokens=95))
    )
    with replay_server(script) as upstream:
        text = config_text(upstream.base_url, flushed, rpm=100) + "tpm = 150\n"
        with gateway(text) as gw:
            codes = []
            for _ in range(3):
                body = {**CHAT_BODY, "stream": stream, "max_tokens": 1}
                r = httpx.post(gw.v1 + "/chat/completions", json=body, headers=KEY)
                r.read()
                codes.append(r.status_code)
    assert codes == [200, 200, 429]
    assert 1 <= int(r.headers["retry-after"]) <= 10


def limited_by_tpm(base: str, *, backend: str, request, tpm: int, expected_completion_tokens: int = 256) -> str:
    """One upstream, a key limited by ``tpm``, its state in process or in Redis."""
    state = f'[state]\nredis_url = "{request.getfixturevalue("flushed")}"\n\n' if backend == "redis" else ""
    return (
        f'[providers.up]\napi_base = "{base}"\n\n[routing]\nexpected_completion_tokens = {expected_completion_tokens}\n\n'
        f'{state}[[auth.keys]]\nname = "team-a"\nkey = "sk-a"\ntpm = {tpm}\n'
    )


def held_stream(prompt_tokens: int, completion_tokens: int) -> ReplayScript:
    """A stream whose first content is sent at once, the rest (usage: these counts) once
    ``server.resume`` is set: streams provably in flight together."""
    body = stream_with_usage(prompt_tokens, completion_tokens)
    first = body.index(b"\n\n", body.index(b'"ok"')) + 2
    return ReplayScript(
        headers=(("content-type", "text/event-stream"),),
        body_pieces=(body[:first], body[first:]),
        hold_after_pieces=1,
    )


async def concurrent_streams(url: str, upstream, count: int) -> list[httpx.Response]:
    """``count`` streams sent at once; once each has its status, the upstream goes on."""
    heads = [asyncio.Event() for _ in range(count)]
    async with httpx.AsyncClient(timeout=30) as client:

        async def one(head: asyncio.Event) -> httpx.Response:
            async with client.stream("POST", url, json={**CHAT_BODY, "stream": True}, headers=KEY) as r:
                head.set()
                await r.aread()
                return r

        tasks = [asyncio.create_task(one(head)) for head in heads]
        await asyncio.gather(*(head.wait() for head in heads))
        upstream.resume.set()
        return await asyncio.gather(*tasks)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_burst_of_streams_naming_no_max_tokens_is_charged_their_expected_completion(backend, request) -> None:
    # Ten concurrent streams, tpm 1000, no max_tokens: each is charged its prompt plus
    # the 256 completion tokens routing expects, so 3 go (using 3 x 305 = 915) and 7 get
    # 429 at once. Charged for their prompts alone, all 10 went and spent 3,050.
    with replay_server(held_stream(5, 300)) as upstream:
        text = limited_by_tpm(upstream.base_url, backend=backend, request=request, tpm=1000)
        with gateway(text) as gw:
            answers = asyncio.run(concurrent_streams(gw.v1 + "/chat/completions", upstream, 10))
            codes = sorted(r.status_code for r in answers)
            assert codes == [200] * 3 + [429] * 7
            assert proxied_posts(upstream) == 3
            assert all(1 <= int(r.headers["retry-after"]) <= 60 for r in answers if r.status_code == 429)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_tokens_used_beyond_the_charge_lock_a_key_out_for_at_most_a_minute(backend, request) -> None:
    # A poor expectation (10 completion tokens) admits all ten streams; each uses 1,000
    # tokens, ten minutes' worth of tpm 1000. The debt carried forward is bounded: the
    # key is full, and a small request waits about a second (uncapped: ~9 minutes).
    with replay_server(held_stream(5, 995)) as upstream:
        text = limited_by_tpm(upstream.base_url, backend=backend, request=request, tpm=1000, expected_completion_tokens=10)
        with gateway(text) as gw:
            answers = asyncio.run(concurrent_streams(gw.v1 + "/chat/completions", upstream, 10))
            assert [r.status_code for r in answers] == [200] * 10

            def refused() -> httpx.Response | None:  # once the streams' settles have run
                r = httpx.post(gw.v1 + "/chat/completions", json={**CHAT_BODY, "max_tokens": 1}, headers=KEY)
                return r if r.status_code == 429 else None

            after = poll(refused, timeout=10, what="the key to be refused")
            assert int(after.headers["retry-after"]) <= 5


def test_concurrent_charges_from_many_replicas_never_exceed_the_limit(flushed) -> None:
    async def scenario() -> int:
        replicas = [RedisStore(url=flushed, timeout_seconds=2) for _ in range(4)]
        quota = Quota(key="rl:{race}:rpm", limit=25, cost=1)
        verdicts = await asyncio.gather(*(replicas[i % 4].acquire([quota]) for i in range(200)))
        for replica in replicas:
            await replica.aclose()
        return sum(v.allowed for v in verdicts)

    assert asyncio.run(scenario()) == 25


def test_redis_and_in_process_state_give_the_same_verdicts(flushed) -> None:
    # Same sequence of charges and corrections, well inside a second: same answers.
    async def verdicts(store) -> list[tuple[bool, int, tuple[int, ...]]]:
        rpm, tpm = Quota(key="rl:{p}:rpm", limit=4, cost=1), Quota(key="rl:{p}:tpm", limit=100, cost=30)
        out = []
        for step in range(8):
            verdict = await store.acquire([rpm, tpm])  # whole seconds: Redis's clock moves on meanwhile
            out.append(
                (verdict.allowed, round(verdict.retry_after_seconds), tuple(round(r) for r in verdict.room_in_seconds))
            )
            if verdict.allowed and step % 2:
                await store.adjust(tpm, delta=-30)
        await store.aclose()
        return out

    redis_answers = asyncio.run(verdicts(RedisStore(url=flushed, timeout_seconds=2)))
    assert redis_answers == asyncio.run(verdicts(MemoryStore()))
    assert [allowed for allowed, _, _ in redis_answers] == [True, True, True, True, False, False, False, False]
    # the waits to the next fitting charge: RPM full after the 4th request (15 s a unit)
    assert [rooms[0] for _, _, rooms in redis_answers] == [0, 0, 0, 15, 15, 15, 15, 15]


def test_redis_and_in_process_state_give_the_same_verdicts_to_bursts(flushed) -> None:
    # Bursts of ten concurrent charges (pipelined script calls on one connection) with
    # the corrections of their settles in between: same answers from both stores.
    async def burst(store, quota: Quota) -> list[tuple[bool, int]]:
        answers = await asyncio.gather(*(store.acquire([quota]) for _ in range(10)))
        return [(v.allowed, round(v.retry_after_seconds)) for v in answers]

    async def verdicts(store) -> list[list[tuple[bool, int]]]:
        out = []
        # expected completions pre-charged (prompt 10 + 256), each used 305: close
        expected = Quota(key="rl:{b}:tpm", limit=1000, cost=266)
        first = await burst(store, expected)
        for allowed, _ in first:
            if allowed:
                await store.adjust(expected, delta=305 - 266)
        out += [first, await burst(store, expected)]
        # a poor estimate (15 charged), each used 1000: ten minutes' worth in one burst
        underestimated = Quota(key="rl:{c}:tpm", limit=1000, cost=15)
        first = await burst(store, underestimated)
        for allowed, _ in first:
            if allowed:
                await store.adjust(underestimated, delta=1000 - 15)
        out += [first, await burst(store, underestimated)]
        await store.aclose()
        return out

    redis_answers = asyncio.run(verdicts(RedisStore(url=flushed, timeout_seconds=2)))
    assert redis_answers == asyncio.run(verdicts(MemoryStore()))
    expected_first, expected_next, under_first, under_next = redis_answers
    assert [a for a, _ in expected_first] == [True] * 3 + [False] * 7  # 3 x 266 fit 1000, a 4th not
    assert expected_next == [(False, 11)] * 10  # 915 used: 266 more fit in 11 s
    assert under_first == [(True, 0)] * 10
    # the debt is bounded: the key is full (one window ahead), not 10 minutes in debt;
    # a charge of 15 fits again in under a second (uncapped: 541 s)
    assert under_next == [(False, 1)] * 10


def test_one_replicas_ejection_is_seen_by_the_other_and_a_success_restores_it_everywhere(flushed) -> None:
    text = config_text("http://127.0.0.1:9", flushed, endpoints=2)
    config = load_config_text(text, source="t.toml", env={})

    async def scenario() -> None:
        replicas = []
        for _ in range(2):
            metrics = Metrics(providers=config.providers, models=set())
            client = UpstreamClient(connect_timeout_seconds=1, read_timeout_seconds=1)
            replicas.append(
                Gateway(
                    config=config,
                    client=client,
                    metrics=metrics,
                    store=RedisStore(url=flushed, timeout_seconds=2),
                )
            )
        a, b = replicas
        redis = Redis.from_url(flushed)
        a_endpoint, b_endpoint = a.pool["up"].endpoints[0], b.pool["up"].endpoints[0]
        for _ in range(config.health.failure_threshold):
            a.pool.record_outcome(a.pool["up"], a_endpoint, ok=False)
        assert not a_endpoint.healthy
        await a.health_sync.sync_once()  # A publishes
        await b.health_sync.sync_once()  # B adopts
        assert not b_endpoint.healthy
        assert b.pool["up"].endpoints[1].healthy
        assert 'latgate_provider_healthy{endpoint="up-0",provider="up"} 0.0' in b.metrics.render()[0].decode()
        ttl_ms = await redis.pttl("latgate:health:up:up-0")
        assert 0 < ttl_ms <= 30_000  # a mark expires: a stopped replica cannot keep it out forever
        await redis.pexpire("latgate:health:up:up-0", 50)
        await a.health_sync.sync_once()  # A still sees it broken: it keeps its mark alive
        assert await redis.pttl("latgate:health:up:up-0") > 1000
        b.pool.record_outcome(b.pool["up"], b_endpoint, ok=True)  # B sees it work again
        assert b_endpoint.healthy
        await b.health_sync.sync_once()  # B publishes the recovery
        await a.health_sync.sync_once()  # A adopts it
        assert a_endpoint.healthy and b_endpoint.healthy
        assert await redis.exists("latgate:health:up:up-0") == 0
        await redis.aclose()
        for gw in replicas:
            await gw.store.aclose()
            await gw.client.aclose()

    asyncio.run(scenario())


def test_a_replica_that_stops_cannot_keep_an_endpoint_out(flushed) -> None:
    config = load_config_text(
        config_text("http://127.0.0.1:9", flushed, endpoints=2), source="t.toml", env={}
    )

    async def scenario() -> None:
        metrics = Metrics(providers=config.providers, models=set())
        client = UpstreamClient(connect_timeout_seconds=1, read_timeout_seconds=1)
        b = Gateway(
            config=config, client=client, metrics=metrics, store=RedisStore(url=flushed, timeout_seconds=2)
        )
        redis = Redis.from_url(flushed)
        await redis.set("latgate:health:up:up-1", b"ejected", px=60_000)  # left by a replica now gone
        await b.health_sync.sync_once()
        assert not b.pool["up"].endpoints[1].healthy
        await redis.delete("latgate:health:up:up-1")  # what its expiry does
        await b.health_sync.sync_once()
        assert b.pool["up"].endpoints[1].healthy
        await redis.aclose()
        await b.store.aclose()
        await client.aclose()

    asyncio.run(scenario())


def accepted(sock: socket.socket) -> int:
    """Accept (and close) every connection waiting on listening ``sock``; how many."""
    sock.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def test_unreachable_redis_fails_fast_then_backs_off_without_io(caplog) -> None:
    silent = listening_socket()  # accepts connections and never answers
    port = silent.getsockname()[1]
    caplog.set_level(logging.WARNING, logger="latgate.store")

    async def scenario() -> tuple[float, int, int]:
        store = RedisStore(
            url=f"redis://:hunter2@127.0.0.1:{port}/0", timeout_seconds=0.1, backoff_seconds=60
        )
        started = time.perf_counter()
        with pytest.raises(StoreUnavailable):
            await store.acquire([Quota(key="k", limit=1, cost=1)])
        first = time.perf_counter() - started
        connects_first = accepted(silent)
        with pytest.raises(StoreUnavailable):
            await store.acquire([Quota(key="k", limit=1, cost=1)])
        connects_second = accepted(silent)
        await store.adjust(Quota(key="k", limit=1, cost=1), delta=1)  # swallowed
        await store.aclose()
        return first, connects_first, connects_second

    try:
        first, connects_first, connects_second = asyncio.run(scenario())
    finally:
        silent.close()
    assert first < 2, f"a 0.1 s Redis timeout took {first:.2f} s"  # bounded, not hung
    assert connects_first >= 1, "the first call never tried Redis"
    assert connects_second == 0, "in back-off a call still opened a connection to Redis"
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert "unreachable" in text
    assert "hunter2" not in text and str(port) not in text


def test_an_unreachable_redis_is_logged_with_its_cause_and_its_return_at_info(caplog) -> None:
    """The warning says why (a refused connection), never the URL's password or port;
    Redis coming back is an INFO line."""
    port = free_port()  # nothing listens there until redis-server starts on it below
    clock = ManualClock()
    caplog.set_level(logging.INFO, logger="latgate.store")

    async def scenario() -> bool:
        store = RedisStore(url=f"redis://:hunter2@127.0.0.1:{port}/0", timeout_seconds=2, backoff_seconds=5, clock=clock)
        with pytest.raises(StoreUnavailable):
            await store.acquire([Quota(key="k", limit=5, cost=1)])
        with redis_server("--requirepass", "hunter2", port=port):
            clock.now += 6  # past the back-off: the next call tries Redis again
            verdict = await store.acquire([Quota(key="k", limit=5, cost=1)])
            await store.aclose()
        return verdict.allowed

    assert asyncio.run(scenario())
    down, back = [(r.levelno, r.getMessage()) for r in caplog.records if "shared store" in r.getMessage()]
    assert down[0] == logging.WARNING and "unreachable (cannot connect: connection refused)" in down[1], down
    assert back == (logging.INFO, "the shared store (Redis) is reachable again")
    assert "hunter2" not in caplog.text and str(port) not in caplog.text


def test_limits_survive_a_config_reload(flushed, tmp_path: Path) -> None:
    # In-process state too: a reload with the same [state] keeps the counters.
    with replay_server(ReplayScript.json_response(200, COMPLETION)) as upstream:
        text = (
            f'[providers.up]\napi_base = "{upstream.base_url}"\n\n'
            '[[auth.keys]]\nname = "team-a"\nkey = "sk-a"\nrpm = 2\n\n'
            '[[auth.keys]]\nname = "ops"\nkey = "sk-ops"\nadmin = true\n'
        )
        path = tmp_path / "latgate.toml"
        path.write_text(text)


        with gateway_file(path) as stack:
            url = stack.url
            assert [
                httpx.post(url + "/v1/chat/completions", json=CHAT_BODY, headers=KEY).status_code for _ in range(2)
            ] == [200, 200]
            reload = httpx.post(url + "/admin/reload", headers={"Authorization": "Bearer sk-ops"})
            assert reload.status_code == 200
            assert httpx.post(url + "/v1/chat/completions", json=CHAT_BODY, headers=KEY).status_code == 429


def test_concurrent_calls_on_one_connection_each_get_their_own_reply(flushed) -> None:
    async def scenario() -> list[bool]:
        store = RedisStore(url=flushed, timeout_seconds=2)
        # 100 keys of limit 1, each charged twice at once: exactly the first charge of each fits
        charges = [store.acquire([Quota(key=f"k{i % 100}", limit=1, cost=1)]) for i in range(200)]
        verdicts = await asyncio.gather(*charges)
        await store.aclose()
        return [v.allowed for v in verdicts]

    allowed = asyncio.run(scenario())
    assert allowed == [True] * 100 + [False] * 100


def test_a_server_that_forgot_the_scripts_is_sent_them_again(flushed) -> None:
    async def scenario() -> tuple[bool, bool]:
        store = RedisStore(url=flushed, timeout_seconds=2)
        first = await store.acquire([Quota(key="s", limit=2, cost=1)])
        admin = Redis.from_url(flushed)
        await admin.script_flush()
        await admin.aclose()
        second = await store.acquire([Quota(key="s", limit=2, cost=1)])
        third = await store.acquire([Quota(key="s", limit=2, cost=1)])
        await store.aclose()
        return first.allowed and second.allowed, third.allowed

    assert asyncio.run(scenario()) == (True, False)


def test_a_correction_with_no_charge_after_it_reaches_the_other_replicas_on_its_own(flushed) -> None:
    async def scenario() -> None:
        store, other = RedisStore(url=flushed, timeout_seconds=2), RedisStore(url=flushed, timeout_seconds=2)
        tpm = Quota(key="rl:{c}:tpm", limit=100, cost=100)
        assert (await store.acquire([tpm])).allowed  # the whole minute taken
        await store.adjust(tpm, delta=-100)  # and given back, with no charge after it
        half = Quota(key="rl:{c}:tpm", limit=100, cost=50)
        deadline = time.monotonic() + 10
        while not (await other.acquire([half])).allowed:  # a refused charge takes nothing
            assert time.monotonic() < deadline, "the correction never reached Redis"
            await asyncio.sleep(0.05)
        await store.aclose()
        await other.aclose()

    asyncio.run(scenario())
