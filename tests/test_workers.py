"""``latgate serve --workers N``: one socket, N worker processes, ``/metrics`` that counts
every worker's requests, reload and drain through the supervisor, dead workers replaced."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest
from gateway_process import GatedUpstream, GatewayProcess
from servers import listening_socket, serve_app
from stack import default_route_config, simulator_urls

from latgate.process.workers import MIN_UPTIME_SECONDS

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
WORKER_SERVING = r"worker (\d) \(pid (\d+)\) serving"


@pytest.fixture
def sims():
    with simulator_urls(("a", "b")) as urls:
        yield urls


def start_workers(
    config: Path,
    *,
    workers: int = 2,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
    port: str | None = "0",
):
    """The supervisor, its URL and ``{worker index: pid}`` once every worker serves
    (``port`` None: the config file's port)."""
    ports = ["--port", port] if port is not None else []
    gw = GatewayProcess(["--config", str(config), *ports, "--workers", str(workers), *extra], env=env)
    url = gw.wait_listening()
    pids = {}
    while len(pids) < workers:
        match = gw.wait_for(WORKER_SERVING)
        pids[int(match.group(1))] = int(match.group(2))
    return gw, url, pids


def scrape(url: str) -> str:
    with httpx.Client() as client:  # a new connection: any worker may answer
        return client.get(url + "/metrics").text


def requests_total(text: str, provider: str) -> float:
    pattern = rf'^latgate_requests_total\{{code="200",model="other",provider="{provider}"\}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_metrics_count_every_workers_requests_and_a_dead_worker_comes_back(tmp_path, sims) -> None:
    config = tmp_path / "config.toml"
    config.write_text(default_route_config(sims, default="a"))
    metrics_dir = tmp_path / "prom"
    gw, url, pids = start_workers(config, env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    serving_since = time.monotonic()
    try:
        # Requests on new connections until both workers have answered some (each worker's
        # samples live in its own files; the in-flight gauge's, livesum, appears with its
        # first request, while counters are created at start), so the scrapes below must
        # add them up.
        sent = 0
        while {p for p in pids.values() if (metrics_dir / f"gauge_livesum_{p}.db").exists()} != set(pids.values()):
            assert sent < 400, "the kernel never handed a connection to the second worker"
            with httpx.Client() as client:
                assert client.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
            sent += 1
        # Scrape at least 6 times, and until worker 0 has been up longer than the
        # supervisor's MIN_UPTIME_SECONDS: killed sooner, it would count as one that
        # could not start rather than one that died.
        scrapes = 0
        while scrapes < 6 or time.monotonic() - serving_since <= MIN_UPTIME_SECONDS:
            scrapes += 1
            text = scrape(url)
            assert requests_total(text, "a") == sent
            assert 'latgate_in_flight_requests{provider="a"} 0.0' in text
            assert re.search(
                r'^latgate_provider_healthy\{endpoint="a-0",provider="a"\} 1\.0$', text, re.MULTILINE
            )
            assert "pid=" not in text

        # A dead worker is started again; with the config file broken meanwhile it cannot
        # start, the other keeps serving, and the next good reload brings it back.
        good = config.read_text()
        config.write_text(good.replace("default_route", "default_rout"))
        os.kill(pids[0], signal.SIGKILL)
        gw.wait_for(rf"worker 0 \(pid {pids[0]}\) exited with status -9; starting another")
        gw.wait_for(r"worker 0 could not start \(status 3\); 1 workers serve until a reload")
        assert requests_total(scrape(url), "a") == sent  # the dead worker's counts stay
        with httpx.Client() as client:
            assert client.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
        config.write_text(good)
        gw.signal(signal.SIGHUP)
        gw.wait_for("starting worker 0 again")
        replacement = int(gw.wait_for(WORKER_SERVING).group(2))
        assert replacement not in pids.values()
        assert requests_total(scrape(url), "a") == sent + 1

        gw.signal(signal.SIGTERM)
        assert gw.wait_exit(timeout=30) == 0
    finally:
        gw.stop()
    assert not any("Traceback" in line for line in gw.lines)
    assert not list(metrics_dir.glob("gauge_live*"))  # dead workers' live gauges are dropped


def wait_every_worker_reloaded(gw: GatewayProcess, pids: dict[int, int], pattern: str) -> list[str]:
    """The first line matching ``pattern`` from each worker (a line of ``latgate[PID]``)."""
    reloaded: dict[int, str] = {}
    while set(reloaded) != set(pids.values()):
        match = gw.wait_for(r"latgate\[(\d+)\] " + pattern)
        reloaded.setdefault(int(match.group(1)), match.string)
    return list(reloaded.values())


def test_reload_reaches_every_worker_and_a_bad_config_reaches_none(tmp_path, sims) -> None:
    config = tmp_path / "config.toml"
    config.write_text(default_route_config(sims, default="a"))
    gw, url, pids = start_workers(config)

    try:
        config.write_text(default_route_config(sims, default="b"))
        gw.signal(signal.SIGHUP)
        gw.wait_for("SIGHUP: reloading 2 workers")
        wait_every_worker_reloaded(gw, pids, "reloaded .*: providers a, b")

        config.write_text(default_route_config(sims, default="nowhere"))
        gw.signal(signal.SIGHUP)
        assert (
            "routing.default_route" in gw.wait_for("reload rejected, workers keep the previous config").string
        )
        for _ in range(4):
            with httpx.Client() as client:
                assert (
                    client.post(url + "/v1/chat/completions", json=CHAT).headers["x-latgate-provider"] == "b"
                )

        # Over HTTP one worker answers; it has the supervisor reload the others.
        config.write_text(default_route_config(sims, default="a"))
        response = httpx.post(url + "/admin/reload")
        assert response.status_code == 200 and response.json()["status"] == "reloaded"
        gw.wait_for("SIGHUP: reloading 2 workers")
        wait_every_worker_reloaded(gw, pids, "reloaded")
        for _ in range(4):
            with httpx.Client() as client:
                assert (
                    client.post(url + "/v1/chat/completions", json=CHAT).headers["x-latgate-provider"] == "a"
                )

        gw.signal(signal.SIGTERM)
        assert gw.wait_exit(timeout=30) == 0
    finally:
        gw.stop()


def test_every_worker_compares_a_reloaded_port_with_the_one_it_listens_on(tmp_path, sims) -> None:
    with listening_socket() as probe:
        port = probe.getsockname()[1]
    listen = f"[server]\nport = {port}\n" + default_route_config(sims, default="a")
    config = tmp_path / "config.toml"
    config.write_text(listen)
    gw, url, pids = start_workers(config, port=None)
    try:
        assert url == f"http://127.0.0.1:{port}"
        config.write_text(listen.replace(f"port = {port}", "port = 1"))
        gw.signal(signal.SIGHUP)
        moved = wait_every_worker_reloaded(gw, pids, "reloaded ")
        assert all("server.port changed: applies after a restart" in line for line in moved), moved
        config.write_text(listen)  # back to where the workers listen
        gw.signal(signal.SIGHUP)
        back = wait_every_worker_reloaded(gw, pids, "reloaded ")
        assert not any("changed" in line for line in back), back
        gw.signal(signal.SIGTERM)
        assert gw.wait_exit(timeout=30) == 0
    finally:
        gw.stop()


def test_sigterm_to_the_supervisor_drains_a_stream_in_flight(tmp_path) -> None:
    gated = GatedUpstream()
    with serve_app(gated) as upstream:
        config = tmp_path / "config.toml"
        config.write_text(default_route_config({"gated": upstream}, default="gated"))
        gw, url, _ = start_workers(config, extra=("--drain-timeout", "20"))
        try:
            with httpx.Client(timeout=30) as client:
                request = client.build_request(
                    "POST", url + "/v1/chat/completions", json={**CHAT, "stream": True}
                )
                stream = client.send(request, stream=True)
                assert gated.started.wait(timeout=10)
                gw.signal(signal.SIGTERM)
                gw.wait_for("SIGTERM: stopping 2 workers")
                gw.wait_for(r"draining: SIGTERM received, stopped accepting; 1 connection\(s\) open")
                gated.gate.set()
                lines = [line for line in stream.iter_lines() if line]
                stream.close()
            assert lines[-1] == "data: [DONE]"
            assert gw.wait_exit(timeout=20) == 0
        finally:
            gated.gate.set()
            gw.stop()


def test_workers_must_be_at_least_one(tmp_path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n')
    gw = GatewayProcess(["--config", str(config), "--workers", "0"])
    assert gw.wait_exit(timeout=30) == 2
    assert gw.lines == ["latgate: error: --workers must be at least 1"]


def gone(pid: int) -> bool:
    """The process ended (reaped, or a zombie nobody reaps in this container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_connections_spread_evenly_over_the_workers(tmp_path, sims) -> None:
    config = tmp_path / "config.toml"
    config.write_text(default_route_config(sims, default="a"))
    gw, url, pids = start_workers(config)
    try:
        for _ in range(200):
            with httpx.Client() as client:  # a new connection each
                assert client.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
        served = {pid: 0 for pid in pids.values()}
        while sum(served.values()) < 200:
            match = gw.wait_for(r"latgate\.access\[(\d+)\]")
            served[int(match.group(1))] += 1
        assert min(served.values()) >= 60, served  # an even split is 100/100; 93/7 was one socket's
    finally:
        gw.stop()


def test_workers_exit_when_the_supervisor_is_killed_and_a_restart_binds_cleanly(tmp_path, sims) -> None:
    config = tmp_path / "config.toml"
    config.write_text(default_route_config(sims, default="a"))
    gw, url, pids = start_workers(config)
    port = url.rsplit(":", 1)[1]
    os.kill(gw.proc.pid, signal.SIGKILL)
    gw.wait_exit(timeout=10)
    deadline = time.monotonic() + 30
    while not all(gone(pid) for pid in pids.values()):
        assert time.monotonic() < deadline, "workers still serve without their supervisor"
        time.sleep(0.05)  # polling a process table: no event to wait on
    again = GatewayProcess(["--config", str(config), "--port", port, "--workers", "2"])
    try:
        assert again.wait_listening() == url
        for _ in range(2):
            again.wait_for(WORKER_SERVING)
        with httpx.Client() as client:
            assert client.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
    finally:
        again.stop()
