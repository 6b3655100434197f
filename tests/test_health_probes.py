"""Active probes and engine load gauges: the monitor on real loopback servers, and its
start and stop with the app's lifespan."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import httpx
from h1_upstreams import OK_JSON, RawUpstream, json_reply, keep_serving
from servers import serve_app
from stack import gateway

from latgate.commands.sim import SimOptions, create_sim_app
from latgate.foundation.config import load_config_text
from latgate.foundation.metrics import Metrics
from latgate.live.providers import ProviderPool
from latgate.live.providers.monitor import Monitor, parse_gauges, root_url
from latgate.transport.upstream import UpstreamClient

VLLM_TEXT = """# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b"} 2.0
vllm:num_requests_waiting{model_name="a"} 4.0 1712345678000
vllm:num_requests_waiting_by_reason{reason="x"} 99.0
"""


def test_gauges_are_summed_over_their_label_sets() -> None:
    gauges = parse_gauges(VLLM_TEXT, ("vllm:num_requests_running", "vllm:num_requests_waiting"))
    assert gauges == {"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 4.0}


def test_unparsable_or_missing_gauges_are_absent() -> None:
    assert parse_gauges("sglang:num_queue_reqs nan-ish\n", ("sglang:num_queue_reqs", "other")) == {}


def test_root_url_drops_the_version_segment() -> None:
    assert root_url("http://h:1/v1") == "http://h:1"
    assert root_url("https://taotoken.net/api/v1") == "https://taotoken.net/api"


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"  # nothing listens there once closed


def pool_for(text: str, env: dict[str, str] | None = None) -> ProviderPool:
    config = load_config_text(text, source="test.toml", env=env or {})
    return ProviderPool(config, metrics=Metrics(providers=config.providers, models=[]), env=env or {})


def run_monitor_once(pool: ProviderPool, *, probes: int = 1, load: bool = False) -> None:
    async def main() -> None:
        client = UpstreamClient(connect_timeout_seconds=1, read_timeout_seconds=2)
        monitor = Monitor(pool=pool, client=client)
        try:
            for _ in range(probes):
                await monitor.probe_once()
            if load:
                await monitor.read_load_once()
        finally:
            await client.aclose()

    asyncio.run(main())


def test_engine_load_gauges_are_read_from_a_vllm_style_metrics_page() -> None:
    sim = create_sim_app(SimOptions(max_batch_size=4))
    with serve_app(sim) as url:
        pool = pool_for(f'[providers.v]\napi_base = "{url}/v1"\nconnector = "vllm"\n')
        generations = [sim.engine.start(prompt_tokens=10) for _ in range(3)]  # three requests hold slots
        run_monitor_once(pool, probes=0, load=True)
        for generation in generations:
            generation.close()
    endpoint = pool["v"].endpoints[0]
    assert (endpoint.engine_running, endpoint.engine_waiting) == (3, 0)
    assert endpoint.load(now=pool.clock()) == 3, "three requests that are not latgate's count as load"


def test_a_probed_endpoint_that_answers_stays_healthy_and_shows_the_probe() -> None:
    with serve_app(create_sim_app(SimOptions())) as url:
        pool = pool_for(f'[providers.p]\napi_base = "{url}/v1"\n')
        run_monitor_once(pool)
    endpoint = pool["p"].endpoints[0]
    assert endpoint.probe_ok and endpoint.healthy and endpoint.probe_ms is not None


def test_probes_of_an_idle_endpoint_are_plain_gets_on_one_kept_connection() -> None:
    """Probes go through latgate's own HTTP/1.1 pool, as proxied requests do (latgate's
    user agent, uncompressed answers): a GET with the provider's key and no body, the
    connection kept for the next round."""
    with RawUpstream(keep_serving(json_reply(OK_JSON))) as up:
        pool = pool_for(f'[providers.p]\napi_base = "{up.base_url}"\napi_key_env = "P_KEY"\n', {"P_KEY": "sk-probe-key"})
        run_monitor_once(pool, probes=3)
        up.wait_until(lambda: len(up.requests) == 3)
        assert up.total == 1, "every probe opened a connection of its own"
    head = up.requests[0].split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"get /v1/models http/1.1\r\n")
    assert b"authorization: bearer sk-probe-key" in head and b"content-length" not in head
    assert b"\r\nuser-agent: latgate/" in head and b"\r\naccept-encoding: identity\r\n" in head
    assert pool["p"].endpoints[0].probe_ok


def test_probes_answered_with_a_5xx_on_a_kept_connection_eject_the_endpoint() -> None:
    with RawUpstream(keep_serving(json_reply(b'{"error":"down"}', status=b"503 Service Unavailable"))) as up:
        pool = pool_for(f'[providers.p]\nendpoints = ["{up.base_url}", "{closed_port_url()}"]\n')
        run_monitor_once(pool, probes=2)
    endpoint = pool["p"].endpoints[0]
    assert not endpoint.probe_ok and not endpoint.healthy
    assert pool.breaker.store.get(endpoint.key).reason == "probes"


def test_two_failed_probes_eject_an_endpoint_nobody_sent_traffic_to() -> None:
    pool = pool_for(f'[providers.p]\nendpoints = ["{closed_port_url()}", "http://127.0.0.1:9/v1"]\n')
    run_monitor_once(pool)
    assert pool["p"].endpoints[0].healthy
    run_monitor_once(pool)
    assert not pool["p"].endpoints[0].healthy and not pool.any_healthy()
    assert pool.breaker.store.get(pool["p"].endpoints[0].key).reason == "probes"


def test_an_endpoint_that_just_answered_a_request_is_not_probed() -> None:
    pool = pool_for(f'[providers.p]\napi_base = "{closed_port_url()}"\n')
    runtime = pool["p"]
    pool.record_outcome(runtime, runtime.endpoints[0], ok=True)
    run_monitor_once(pool, probes=3)
    assert runtime.endpoints[0].probe_at is None and runtime.endpoints[0].healthy


class MetricsPage:
    """An upstream whose /metrics says 3 running, 1 waiting, and tells the test it was read."""

    def __init__(self) -> None:
        self.read = threading.Event()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics":
            body = b"vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n"
            self.read.set()
        else:
            body = b'{"object": "list", "data": []}'
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})


def test_the_prefix_cache_facts_are_read_from_the_same_metrics_page() -> None:
    """vLLM 0.32's own page: its cache config gives the capacity in tokens."""
    page = (Path(__file__).parent / "fixtures" / "vllm-0.32-cpu" / "metrics_sample.txt").read_bytes()

    async def vllm_metrics(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": page if scope["path"] == "/metrics" else b"{}"})

    with serve_app(vllm_metrics) as url:
        pool = pool_for(f'[providers.v]\napi_base = "{url}/v1"\nconnector = "vllm"\n')
        run_monitor_once(pool, probes=0, load=True)
        cache = pool["v"].endpoints[0].engine_cache
        pool = pool_for(f'[providers.o]\napi_base = "{url}/v1"\n')  # a plain OpenAI server: not read
        run_monitor_once(pool, probes=0, load=True)
    assert cache is not None and cache.prefix_caching
    assert (cache.capacity_tokens, cache.block_size_tokens) == (8192 * 128, 128)
    assert pool["o"].endpoints[0].engine_cache is None


def test_the_gateway_reads_engine_load_from_start_up_and_shows_it_in_the_admin_view() -> None:
    page = MetricsPage()
    with serve_app(page) as url:
        text = f'[providers.v]\napi_base = "{url}/v1"\nconnector = "vllm"\nmax_batch_size = 2\n'
        with gateway(text) as gw:
            assert page.read.wait(5), "the lifespan started no engine load reads"
            for _ in range(200):  # the read is recorded a moment after the page was served
                endpoint = httpx.get(gw.url + "/admin/providers").json()["providers"]["v"]["endpoints"][0]
                if endpoint["engine"] is not None:
                    break
    assert endpoint["engine"]["running"] == 3 and endpoint["engine"]["waiting"] == 1
    assert endpoint["queue_ms"] > 0, "4 requests on 2 slots: a new one waits"


def test_an_endpoint_open_for_errors_whose_engine_answers_again_gets_its_trial_at_once() -> None:
    sim = create_sim_app(SimOptions())
    with serve_app(sim) as url:
        pool = pool_for(f'[providers.v]\napi_base = "{url}/v1"\nconnector = "vllm"\n[health]\nmax_open_sec = 60\nopen_sec = 60\n')
        runtime = pool["v"]
        endpoint = runtime.endpoints[0]
        for _ in range(5):  # the engine was down: five failed requests
            pool.record_outcome(runtime, endpoint, ok=False)
        assert endpoint.circuit == "open" and not pool.available(endpoint)
        run_monitor_once(pool, probes=0, load=True)  # its /metrics answers
    assert endpoint.circuit == "half_open" and pool.available(endpoint), "a trial now, not in 60 s"
