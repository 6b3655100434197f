"""Per-key RPM and TPM: refused with 429 and Retry-After, tokens estimated before the
call and corrected from the upstream's usage after it."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from clocks import ManualClock
from completions import CHAT_BODY, chat_completion, proxied_posts, stream_with_usage
from replay import ReplayScript, replay_server
from servers import listening_socket
from stack import gateway

from latgate.foundation.errors import GatewayError, RateLimited
from latgate.live.store import MemoryStore, Quota, StoreUnavailable
from latgate.request.auth import Caller, RateLimiter, estimate_tokens

KEY = {"Authorization": "Bearer sk-a"}


def limited_config(base: str, *, rpm: int | None = None, tpm: int | None = None) -> str:
    limits = "".join(
        f"{name} = {value}\n" for name, value in (("rpm", rpm), ("tpm", tpm)) if value is not None
    )
    return f'[providers.up]\napi_base = "{base}"\n\n[[auth.keys]]\nname = "team-a"\nkey = "sk-a"\n{limits}'


# -- the limiter on in-process state, with an injected clock -------------------------


def run(coro):
    return asyncio.run(coro)


def test_rpm_admits_a_burst_of_the_limit_then_refuses_with_the_wait_until_one_frees() -> None:
    clock = ManualClock()
    limiter = RateLimiter(store=MemoryStore(clock=clock), fail_open=True)
    caller = Caller(name="a", rpm=3)
    for _ in range(3):
        run(limiter.admit(caller, prompt_tokens=0))
    with pytest.raises(RateLimited) as refused:
        run(limiter.admit(caller, prompt_tokens=0))
    assert refused.value.headers["retry-after"] == "20"
    assert "3 requests per minute" in refused.value.message and "'a'" in refused.value.message
    clock.now += 20
    run(limiter.admit(caller, prompt_tokens=0))


def test_a_key_its_last_charge_left_without_room_is_refused_before_its_body_until_one_frees() -> None:
    clock = ManualClock()
    limiter = RateLimiter(store=MemoryStore(clock=clock), fail_open=True, clock=clock)
    caller = Caller(name="a", rpm=2, tpm=1000)
    limiter.check_request_rate(caller)  # nothing known: let through
    run(limiter.admit(caller, prompt_tokens=5))
    limiter.check_request_rate(caller)  # room for one more
    run(limiter.admit(caller, prompt_tokens=5))
    with pytest.raises(RateLimited) as refused:  # the second charge left none: no call needed
        limiter.check_request_rate(caller)
    assert refused.value.headers["retry-after"] == "30"
    clock.now += 30
    limiter.check_request_rate(caller)
    run(limiter.admit(caller, prompt_tokens=5))  # and the store agrees
    # a reload raising the limit is not held to the old limit's note
    with pytest.raises(RateLimited):
        limiter.check_request_rate(caller)
    limiter.check_request_rate(Caller(name="a", rpm=10, tpm=1000))


def test_a_key_over_its_tokens_only_is_not_refused_before_its_body() -> None:
    # tokens can be given back (a correction), so only the request count is noted
    clock = ManualClock()
    limiter = RateLimiter(store=MemoryStore(clock=clock), fail_open=True, clock=clock)
    caller = Caller(name="a", rpm=100, tpm=100)
    run(limiter.admit(caller, completion_tokens=100, prompt_tokens=0))
    with pytest.raises(RateLimited):
        run(limiter.admit(caller, completion_tokens=100, prompt_tokens=0))
    limiter.check_request_rate(caller)


def test_tpm_charges_the_estimate_then_the_reported_usage() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    limiter = RateLimiter(store=store, fail_open=True)
    caller = Caller(name="a", tpm=100)
    reservation = run(limiter.admit(caller, completion_tokens=30, prompt_tokens=10))  # estimate 40
    run(reservation.settle(used_tokens=90))  # the upstream said 90
    with pytest.raises(RateLimited):
        run(limiter.admit(caller, completion_tokens=30, prompt_tokens=10))  # 90 + 40 > 100
    run(limiter.admit(caller, prompt_tokens=10))  # 90 + 10 fits


def test_a_request_that_used_nothing_gives_its_estimate_back() -> None:
    limiter = RateLimiter(store=MemoryStore(clock=ManualClock()), fail_open=True)
    caller = Caller(name="a", tpm=100)
    for _ in range(5):
        reservation = run(limiter.admit(caller, completion_tokens=80, prompt_tokens=10))
        run(reservation.settle(used_tokens=0))


def test_refusal_by_tpm_does_not_spend_rpm() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    limiter = RateLimiter(store=store, fail_open=True)
    caller = Caller(name="a", rpm=2, tpm=100)
    run(limiter.admit(caller, completion_tokens=100, prompt_tokens=0))
    for _ in range(5):
        with pytest.raises(RateLimited):
            run(limiter.admit(caller, completion_tokens=100, prompt_tokens=0))
    clock.now += 60
    run(limiter.admit(caller, prompt_tokens=1))
    run(limiter.admit(caller, prompt_tokens=1))  # rpm 2: both fit, the refusals took nothing


def test_estimate_adds_the_expected_completion_and_never_exceeds_the_limit() -> None:
    assert estimate_tokens(prompt_tokens=10, completion_tokens=50, cap=1000) == 60
    assert estimate_tokens(prompt_tokens=10, completion_tokens=0, cap=1000) == 10
    assert estimate_tokens(prompt_tokens=10, completion_tokens=32000, cap=1000) == 1000


def test_estimate_keeps_the_completion_within_the_models_window() -> None:
    assert estimate_tokens(prompt_tokens=90, completion_tokens=256, cap=1000, context_tokens=100) == 100
    assert estimate_tokens(prompt_tokens=10, completion_tokens=256, cap=1000, context_tokens=100) == 100
    assert estimate_tokens(prompt_tokens=10, completion_tokens=40, cap=1000, context_tokens=100) == 50


def test_tokens_used_beyond_the_charge_leave_the_key_at_worst_full_for_one_minute() -> None:
    clock = ManualClock()
    limiter = RateLimiter(store=MemoryStore(clock=clock), fail_open=True)
    caller = Caller(name="a", tpm=1000)
    reservations = [run(limiter.admit(caller, completion_tokens=10, prompt_tokens=0)) for _ in range(10)]
    for reservation in reservations:  # each used 1000 tokens: 10 minutes' worth against 100 charged
        run(reservation.settle(used_tokens=1000))
    with pytest.raises(RateLimited) as refused:
        run(limiter.admit(caller, completion_tokens=100, prompt_tokens=0))
    assert refused.value.headers["retry-after"] == "6"  # full: 100 tokens come back in 6 s, not 546 s
    clock.now += 6
    run(limiter.admit(caller, completion_tokens=100, prompt_tokens=0))


def test_one_request_larger_than_the_limit_is_still_admitted_on_an_idle_minute() -> None:
    limiter = RateLimiter(store=MemoryStore(clock=ManualClock()), fail_open=True)
    run(limiter.admit(Caller(name="a", tpm=100), completion_tokens=5000, prompt_tokens=900))


class DownStore:
    shared = True

    async def acquire(self, quotas):
        raise StoreUnavailable("down")

    async def adjust(self, quota, *, delta):
        return None

    async def aclose(self):
        return None


def test_unreachable_state_fails_open_or_closed_as_configured() -> None:
    caller = Caller(name="a", rpm=1, tpm=10)
    assert run(RateLimiter(store=DownStore(), fail_open=True).admit(caller, prompt_tokens=1)) is None
    with pytest.raises(GatewayError) as refused:
        run(RateLimiter(store=DownStore(), fail_open=False).admit(caller, prompt_tokens=1))
    assert refused.value.status == 503 and refused.value.code == "rate_limit_state_unavailable"


def test_memory_state_charges_all_quotas_or_none() -> None:
    store = MemoryStore(clock=ManualClock())
    a, b = Quota(key="a", limit=10, cost=6), Quota(key="b", limit=10, cost=6)
    assert run(store.acquire([a])).allowed
    verdict = run(store.acquire([b, a]))
    assert not verdict.allowed and verdict.retry_after_seconds == pytest.approx(12.0)
    assert run(store.acquire([Quota(key="b", limit=10, cost=10)])).allowed  # b was not charged


# -- through the gateway ---------------------------------------------------------------


def test_third_request_over_an_rpm_of_2_gets_429_with_retry_after_and_never_goes_upstream() -> None:
    with replay_server(ReplayScript.json_response(200, chat_completion(prompt_tokens=3, completion_tokens=1))) as upstream:
        with gateway(limited_config(upstream.base_url, rpm=2)) as gw:
            codes = [
                httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY).status_code for _ in range(2)
            ]
            r = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY)
        assert codes == [200, 200]
        assert r.status_code == 429
        error = r.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
        assert 1 <= int(r.headers["retry-after"]) <= 30
        assert r.headers["x-should-retry"] == "true"
        assert proxied_posts(upstream) == 2


def test_a_request_refused_for_its_body_still_counts_against_the_rpm() -> None:
    with (
        replay_server(ReplayScript.json_response(200, chat_completion())) as upstream,
        gateway(limited_config(upstream.base_url, rpm=2)) as gw,
    ):
        bad = httpx.post(gw.v1 + "/chat/completions", json={**CHAT_BODY, "stream": "yes"}, headers=KEY)
        good = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY)
        over = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY)
    assert [bad.status_code, good.status_code, over.status_code] == [400, 200, 429]
    assert proxied_posts(upstream) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_tpm_is_corrected_from_the_reported_usage(stream: bool) -> None:
    # Each answer reports 100 tokens while the estimate is ~10 (max_tokens 1): with a TPM
    # of 150 the third request must be refused (corrected: 200 used), though ~15 would
    # fit estimates. The debt is bounded: the key is at worst full (a 60 s window's
    # worth), so the third waits its own ~10 tokens' share (4 s), not 24 s.
    script = (
        ReplayScript.sse(stream_with_usage(5, 95))
        if stream
        else ReplayScript.json_response(200, chat_completion(prompt_tokens=5, completion_tokens=95))
    )
    body = {**CHAT_BODY, "stream": stream, "max_tokens": 1}
    with replay_server(script) as upstream, gateway(limited_config(upstream.base_url, tpm=150)) as gw:
        codes = []
        for _ in range(3):
            r = httpx.post(gw.v1 + "/chat/completions", json=body, headers=KEY)
            r.read()
            codes.append(r.status_code)
        assert codes == [200, 200, 429]
        assert 1 <= int(r.headers["retry-after"]) <= 10


def test_failed_requests_give_their_token_estimate_back() -> None:
    error = {"error": {"message": "bad", "type": "invalid_request_error"}}
    with (
        replay_server(ReplayScript.json_response(400, error)) as upstream,
        gateway(limited_config(upstream.base_url, tpm=150)) as gw,
    ):
        codes = [
            httpx.post(gw.v1 + "/chat/completions", json={**CHAT_BODY, "max_tokens": 120}, headers=KEY).status_code
            for _ in range(4)
        ]
    assert codes == [400, 400, 400, 400]  # never 429: each ~130-token estimate came back


def test_unreachable_redis_fails_open_quickly_by_default_and_closed_when_configured() -> None:
    silent = _silent_tcp_server()  # accepts, never answers: the worst case for a client
    try:
        port = silent.getsockname()[1]
        state = f'\n[state]\nredis_url = "redis://127.0.0.1:{port}/0"\nredis_timeout_ms = 100\n'
        with replay_server(ReplayScript.json_response(200, chat_completion(prompt_tokens=3, completion_tokens=1))) as upstream:
            with gateway(limited_config(upstream.base_url, rpm=5) + state) as gw:
                r = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY, timeout=5)
                assert r.status_code == 200
                assert r.elapsed.total_seconds() < 2
            with gateway(limited_config(upstream.base_url, rpm=5) + state + "fail_open = false\n") as gw:
                r = httpx.post(gw.v1 + "/chat/completions", json=CHAT_BODY, headers=KEY, timeout=5)
                assert r.status_code == 503
                assert r.json()["error"]["code"] == "rate_limit_state_unavailable"
                assert str(port) not in r.text
                assert r.elapsed.total_seconds() < 2
    finally:
        silent.close()


def _silent_tcp_server():
    return listening_socket()
