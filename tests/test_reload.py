"""Config reload: ``POST /admin/reload`` and SIGHUP swap in a valid config atomically,
reject an invalid one with its reason while the old keeps serving, and let requests in
flight finish on the config they started with."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from gateway_process import GatedUpstream, GatewayProcess
from h1_upstreams import RawUpstream, json_reply, keep_serving
from processes import poll
from replay import ReplayScript, replay_server
from servers import listening_socket, serve_app
from stack import default_route_config, gateway_file, simulator_urls

from latgate.app.reload import UpstreamClients
from latgate.foundation.config import load_config_text
from latgate.transport.upstream import UpstreamClient, UpstreamFailure

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def sims():
    with simulator_urls(("a", "b")) as urls:
        yield urls


@pytest.fixture
def served(tmp_path, sims):
    """A gateway loaded from a config file routing to ``a`` by default: (base URL, config path)."""
    path = tmp_path / "config.toml"
    path.write_text(default_route_config(sims, default="a"))
    with gateway_file(path) as stack:
        yield stack.url, path


@contextlib.contextmanager
def gated_stream(
    tmp_path: Path, sims: dict[str, str]
) -> Iterator[tuple[str, Path, httpx.Client, httpx.Response, Callable[[], None]]]:
    """A gateway loaded from a config file routing by default to an upstream that holds
    its stream, one stream sent through it and begun upstream: (gateway URL, config path,
    the client, the stream, ``release``: the upstream finishes the stream). Released when
    the block leaves at the latest."""
    gated = GatedUpstream()
    with serve_app(gated) as gated_url:
        path = tmp_path / "config.toml"
        path.write_text(default_route_config({"gated": gated_url, "b": sims["b"]}, default="gated"))
        with gateway_file(path) as stack, httpx.Client(timeout=30) as client:
            try:
                stream = client.send(
                    client.build_request("POST", stack.url + "/v1/chat/completions", json={**CHAT, "stream": True}),
                    stream=True,
                )
                assert gated.started.wait(timeout=10)
                yield stack.url, path, client, stream, gated.gate.set
            finally:
                gated.gate.set()


def provider_of(url: str) -> str:
    response = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert response.status_code == 200
    return response.headers["x-latgate-provider"]


def test_reload_endpoint_swaps_in_a_valid_config(served, sims) -> None:
    url, path = served
    assert provider_of(url) == "a"
    path.write_text(default_route_config(sims, default="b"))
    response = httpx.post(url + "/admin/reload")
    assert response.status_code == 200
    assert response.json() == {
        "status": "reloaded",
        "config": str(path),
        "providers": ["a", "b"],
        "added": [],
        "removed": [],
        "restart_needed": [],
    }
    assert provider_of(url) == "b"


def test_reload_endpoint_rejects_an_invalid_config_with_its_reason_and_keeps_serving(served, sims) -> None:
    url, path = served
    path.write_text(default_route_config(sims, default="b").replace("default_route", "defualt_route"))
    response = httpx.post(url + "/admin/reload")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_config"
    assert 'routing.defualt_route: unknown key; did you mean "default_route"?' in error["message"]
    assert "still serving the previous one" in error["message"]
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])  # a fresh one, as every answer has
    given = httpx.post(url + "/admin/reload", headers={"x-request-id": "reload-1"})
    assert given.status_code == 400 and given.headers["x-request-id"] == "reload-1"
    assert provider_of(url) == "a"  # the previous config's default route


def test_reload_masks_a_key_pasted_into_the_config_in_its_answer_and_its_log(served, sims, caplog) -> None:
    url, path = served
    key = "sk-proj-4eC39HqLyjWDarjtT1zdp7dcXk29"
    path.write_text(default_route_config(sims, default="b").replace("[routing]", f'api_key_env = "{key}"\n[routing]'))
    with caplog.at_level(logging.ERROR, logger="latgate"):
        response = httpx.post(url + "/admin/reload")
    assert response.status_code == 400
    assert '"sk-***" is not an environment variable name' in response.json()["error"]["message"]
    assert key not in response.text and key not in caplog.text and "sk-***" in caplog.text
    assert provider_of(url) == "a"


def test_reload_logs_the_warning_serve_logs_at_start_for_an_unset_key_variable(served, sims, caplog) -> None:
    url, path = served
    unset = "LATGATE_RELOAD_TEST_UNSET_KEY"
    assert unset not in os.environ
    path.write_text(default_route_config(sims, default="b").replace("[routing]", f'api_key_env = "{unset}"\n[routing]'))
    with caplog.at_level(logging.WARNING, logger="latgate"):
        assert httpx.post(url + "/admin/reload").status_code == 200  # a warning at start, so not refused here
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and f"api_key_env {unset} is not set" in r.message]
    assert len(warned) == 1, caplog.text
    assert provider_of(url) == "b"


def test_reload_of_a_deleted_config_file_is_rejected(served) -> None:
    url, path = served
    path.unlink()
    response = httpx.post(url + "/admin/reload")
    assert response.status_code == 400 and "no such file" in response.json()["error"]["message"]
    assert provider_of(url) == "a"


def test_a_stream_in_flight_finishes_on_the_config_it_started_with(tmp_path, sims) -> None:
    with gated_stream(tmp_path, sims) as (url, path, client, stream, release):
        try:
            assert stream.headers["x-latgate-provider"] == "gated"
            path.write_text(default_route_config({"b": sims["b"]}, default="b"))
            reloaded = client.post(url + "/admin/reload").json()
            assert reloaded["removed"] == ["gated"] and reloaded["providers"] == ["b"]
            assert provider_of(url) == "b"
            assert list(client.get(url + "/admin/providers").json()["providers"]) == ["b"]
        finally:
            release()
        lines = [line for line in stream.iter_lines() if line]
        stream.close()
    assert lines[-1] == "data: [DONE]" and any('" two"' in line for line in lines)


def test_metrics_keep_counting_across_a_reload_and_drop_removed_endpoints(served, sims) -> None:
    url, path = served
    provider_of(url)
    path.write_text(default_route_config({"b": sims["b"]}, default="b"))
    assert httpx.post(url + "/admin/reload").status_code == 200
    provider_of(url)
    text = httpx.get(url + "/metrics").text
    assert 'latgate_requests_total{code="200",model="other",provider="a"} 1.0' in text
    assert 'latgate_requests_total{code="200",model="other",provider="b"} 1.0' in text
    assert 'latgate_provider_healthy{endpoint="b-0",provider="b"} 1.0' in text
    assert 'provider_healthy{endpoint="a-0"' not in text


def test_reload_that_moves_the_listen_port_says_it_needs_a_restart(served, sims) -> None:
    url, path = served
    path.write_text("[server]\nport = 8123\n" + default_route_config(sims, default="a"))
    response = httpx.post(url + "/admin/reload")
    assert response.status_code == 200 and response.json()["restart_needed"] == ["server.port"]
    assert provider_of(url) == "a"


def test_upstream_client_is_kept_unless_the_default_timeouts_change() -> None:
    clients = UpstreamClients()
    base = load_config_text('[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n', source="c.toml")
    same = load_config_text('[providers.q]\napi_base = "http://127.0.0.1:9/v1"\n', source="c.toml")
    slower = load_config_text(
        '[defaults]\ntimeout_sec = 5\n[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n', source="c.toml"
    )
    first = clients.client_for(base)
    assert clients.client_for(same) is first
    second = clients.client_for(slower)
    assert second is not first

    async def run(url: str) -> tuple[tuple[bool, bool], tuple[bool, bool]]:
        before = await answers(first, url), await answers(second, url)
        await clients.aclose()
        return before, (await answers(first, url), await answers(second, url))

    with RawUpstream(keep_serving(json_reply())) as up:
        assert asyncio.run(run(up.base_url + "/health")) == ((True, True), (False, False))


async def answers(client: UpstreamClient, url: str) -> bool:
    """Whether ``client`` still sends a GET to ``url`` (a closed one refuses)."""
    try:
        await client.get(url=url, headers={}, timeout_seconds=1.0)
    except UpstreamFailure:
        return False
    return True


def test_sighup_reloads_a_valid_config_and_rejects_an_invalid_one(tmp_path, sims) -> None:
    path = tmp_path / "config.toml"
    path.write_text(default_route_config(sims, default="a"))
    gw = GatewayProcess(["--config", str(path), "--port", "0"])
    try:
        url = gw.wait_listening()
        assert provider_of(url) == "a"
        path.write_text(default_route_config(sims, default="b"))
        gw.signal(signal.SIGHUP)
        gw.wait_for(r"reloaded .*config\.toml: providers a, b")
        assert provider_of(url) == "b"
        path.write_text(default_route_config(sims, default="c"))
        gw.signal(signal.SIGHUP)
        line = gw.wait_for("reload rejected, still serving the previous config: ").string
        assert "routing.default_route" in line
        assert provider_of(url) == "b"
        gw.signal(signal.SIGTERM)
        assert gw.wait_exit(timeout=20) == 0
    finally:
        gw.stop()
    assert not any("Traceback" in line for line in gw.lines)


def test_reload_to_a_malformed_redis_url_is_rejected_masked_and_keeps_serving(served, sims, caplog) -> None:
    url, path = served
    bad = "redis://:hunter2-s3cret@127.0.0.1:16399/abc"
    path.write_text(default_route_config(sims, default="b") + f'\n[state]\nredis_url = "{bad}"\n')
    with caplog.at_level(logging.ERROR, logger="latgate"):
        response = httpx.post(url + "/admin/reload")
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "state.redis_url" in message and "database" in message and "redis://:***@127.0.0.1" in message
    assert "hunter2" not in response.text + caplog.text and "Traceback" not in caplog.text
    assert provider_of(url) == "a"


def test_restart_needed_compares_the_file_with_the_address_the_process_listens_on(tmp_path, sims) -> None:
    with listening_socket() as probe:
        port = probe.getsockname()[1]
    listen = f"[server]\nport = {port}\n" + default_route_config(sims, default="a")
    moved = listen.replace(f"port = {port}", f"port = {port + 1 if port < 65535 else port - 1}")
    path = tmp_path / "config.toml"
    path.write_text(listen)
    gw = GatewayProcess(["--config", str(path)])  # the port comes from the file
    try:
        url = gw.wait_listening()
        assert url == f"http://127.0.0.1:{port}"
        path.write_text(moved)
        assert httpx.post(url + "/admin/reload").json()["restart_needed"] == ["server.port"]
        path.write_text(listen)  # back to the port it listens on: nothing to restart for
        assert httpx.post(url + "/admin/reload").json()["restart_needed"] == []
        path.write_text(moved)
        gw.signal(signal.SIGHUP)
        assert "server.port changed: applies after a restart" in gw.wait_for(r"reloaded .*config\.toml").string
        path.write_text(listen)
        gw.signal(signal.SIGHUP)
        assert "changed" not in gw.wait_for(r"reloaded .*config\.toml").string
        assert provider_of(url) == "a"
        gw.signal(signal.SIGTERM)
        assert gw.wait_exit(timeout=20) == 0
    finally:
        gw.stop()


def test_a_port_given_on_the_command_line_never_asks_for_a_restart(tmp_path, sims) -> None:
    path = tmp_path / "config.toml"
    path.write_text(default_route_config(sims, default="a"))
    gw = GatewayProcess(["--config", str(path), "--port", "0"])
    try:
        url = gw.wait_listening()
        path.write_text("[server]\nport = 8123\n" + default_route_config(sims, default="b"))
        reloaded = httpx.post(url + "/admin/reload").json()
        assert reloaded["restart_needed"] == [] and provider_of(url) == "b"  # a restart keeps --port 0
        path.write_text('[server]\nhost = "0.0.0.0"\n' + default_route_config(sims, default="b"))
        assert httpx.post(url + "/admin/reload").json()["restart_needed"] == ["server.host"]
    finally:
        gw.stop()


# -- what a reload keeps: live state of endpoints whose identity is unchanged ---------

CARRY_CONFIG = """
[defaults]
max_retries = 1

[providers.pool]
endpoints = ["{bad}", "{good}/v1"]

[routing]
default_route = "pool"

[health]
probe_interval_sec = 0
failure_threshold = 1
open_sec = 60
"""
UNRELATED_CHANGE = '\n[providers.spare]\napi_base = "http://127.0.0.1:9/v1"\n'  # and [defaults] timeout_sec


def streamed_provider(url: str) -> str:
    """The provider that answered a stream (read to its end)."""
    with httpx.stream("POST", url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10) as r:
        assert r.status_code == 200
        r.read()
        return r.headers["x-latgate-provider"]


def chat_posts(server) -> int:
    return sum(1 for r in server.requests if r.path.endswith("/chat/completions"))


def endpoints_of(url: str) -> dict[str, dict]:
    providers = httpx.get(url + "/admin/providers", timeout=10).json()["providers"]
    return {ep["id"]: ep for ep in providers["pool"]["endpoints"]}


@pytest.mark.parametrize("change", ["same file", "unrelated change"])
def test_a_reload_keeps_an_open_circuit_and_the_learnt_fits(tmp_path, sims, change: str) -> None:
    failing = ReplayScript.json_response(500, {"error": {"message": "engine died", "type": "server_error"}})
    with replay_server(failing) as bad:
        path = tmp_path / "config.toml"
        text = CARRY_CONFIG.format(bad=bad.base_url, good=sims["a"])
        path.write_text(text)
        with gateway_file(path) as stack:
            url = stack.url
            for _ in range(10):  # until a request met the dead replica (and was retried on the other)
                assert streamed_provider(url) == "pool"
                if endpoints_of(url)["pool-0"]["circuit"] == "open":
                    break
            before = endpoints_of(url)
            assert before["pool-0"]["circuit"] == "open" and before["pool-0"]["circuit_reason"] == "errors"
            assert before["pool-1"]["ttft_model"]["observations"] > 0
            posts = chat_posts(bad)
            if change == "unrelated change":
                path.write_text(text.replace("max_retries = 1", "max_retries = 1\ntimeout_sec = 20") + UNRELATED_CHANGE)
            assert httpx.post(url + "/admin/reload").status_code == 200
            after = endpoints_of(url)
            assert after["pool-0"]["circuit"] == "open"
            assert 0 < after["pool-0"]["reopens_in_seconds"] <= before["pool-0"]["reopens_in_seconds"]
            assert after["pool-0"]["failures"] == before["pool-0"]["failures"]
            assert after["pool-1"]["ttft_model"] == {**before["pool-1"]["ttft_model"], "age_seconds": after["pool-1"]["ttft_model"]["age_seconds"]}
            assert after["pool-1"]["requests"] == before["pool-1"]["requests"]
            assert after["pool-1"]["itl_observations"] == before["pool-1"]["itl_observations"]
            assert [streamed_provider(url) for _ in range(10)] == ["pool"] * 10
            assert chat_posts(bad) == posts  # none of the 10 went to the dead replica
            text_metrics = httpx.get(url + "/metrics").text
            assert 'latgate_provider_healthy{endpoint="pool-0",provider="pool"} 0.0' in text_metrics


def test_a_reload_moving_an_endpoint_to_another_url_starts_it_afresh(tmp_path, sims) -> None:
    failing = ReplayScript.json_response(500, {"error": {"message": "engine died", "type": "server_error"}})
    with replay_server(failing) as bad:
        path = tmp_path / "config.toml"
        path.write_text(CARRY_CONFIG.format(bad=bad.base_url, good=sims["a"]))
        with gateway_file(path) as stack:
            url = stack.url
            for _ in range(10):
                streamed_provider(url)
                if endpoints_of(url)["pool-0"]["circuit"] == "open":
                    break
            assert endpoints_of(url)["pool-0"]["circuit"] == "open"
            path.write_text(CARRY_CONFIG.format(bad=sims["b"] + "/v1", good=sims["a"]))  # pool-0 replaced
            assert httpx.post(url + "/admin/reload").status_code == 200
            after = endpoints_of(url)
            assert after["pool-0"]["circuit"] == "closed" and after["pool-0"]["requests"] == 0
            assert after["pool-1"]["requests"] > 0  # the other kept its numbers


def test_a_stream_in_flight_across_a_reload_settles_against_the_carried_counts(tmp_path, sims) -> None:
    with gated_stream(tmp_path, sims) as (url, _, client, stream, release):
        try:
            assert client.post(url + "/admin/reload").status_code == 200  # the same file
            gated_endpoint = client.get(url + "/admin/providers").json()["providers"]["gated"]["endpoints"][0]
            assert gated_endpoint["in_flight"] == 1  # the old stream, still running
        finally:
            release()
        lines = [line for line in stream.iter_lines() if line]
        stream.close()
        assert lines[-1] == "data: [DONE]"

        def settled() -> dict | None:
            ep = client.get(url + "/admin/providers").json()["providers"]["gated"]["endpoints"][0]
            return ep if ep["in_flight"] == 0 else None

        assert poll(settled, timeout=10, what="the stream's end to be counted")["requests"] == 1
        assert 'latgate_in_flight_requests{provider="gated"} 0.0' in client.get(url + "/metrics").text
