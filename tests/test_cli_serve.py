"""``latgate serve`` and ``latgate demo`` as a user runs them: real processes, Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import pytest
from gateway_process import GatewayProcess
from servers import listening_socket

ROOT = Path(__file__).resolve().parent.parent


def free_ports(n: int) -> list[int]:
    socks = [listening_socket() for _ in range(n)]
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "latgate", *args], stderr=subprocess.PIPE, text=True, cwd=ROOT)


def wait_for_line(proc: subprocess.Popen, pattern: str) -> str:
    """Read the process's stderr until a line matches (the process says it is ready)."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"process ended without printing {pattern!r}:\n{''.join(seen)}")


def bundled_config_on_free_ports(tmp_path) -> tuple[Path, int]:
    """The bundled config.toml with its simulators on free ports, and a free gateway port."""
    gw, *sims = free_ports(4)
    text = (ROOT / "config.toml").read_text()
    for old, new in zip(("9101", "9102", "9103"), sims):
        text = text.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    return cfg, gw


def test_demo_serves_the_bundled_system_and_stops_on_ctrl_c(tmp_path) -> None:
    cfg, gw = bundled_config_on_free_ports(tmp_path)
    proc = start(["demo", "--config", str(cfg), "--port", str(gw)])
    try:
        wait_for_line(proc, rf"gateway on http://127\.0\.0\.1:{gw}/v1")
        wait_for_line(proc, rf"live routing page: http://127\.0\.0\.1:{gw}/ui")
        assert httpx.get(f"http://127.0.0.1:{gw}/ui").headers["content-type"].startswith("text/html")
        r = httpx.post(
            f"http://127.0.0.1:{gw}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "stream": True},
            headers={"X-Latency-Sensitive": "1"},
        )
        assert r.status_code == 200 and r.headers["x-latgate-provider"] == "tile-rt"
        assert r.text.rstrip().endswith("data: [DONE]")
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=20) == 0
    assert "Traceback" not in rest


def test_the_demo_labels_claude_codes_model_names_by_name_in_its_metrics(tmp_path) -> None:
    """Claude Code asks for its own claude-* names, which the bundled config serves through
    its catch-all: its tiers are named in the config, so ``/metrics`` says
    ``model="claude-opus-5-5"``, not ``other``; the haiku tier is latency-sensitive."""
    cfg, gw = bundled_config_on_free_ports(tmp_path)
    proc = start(["demo", "--config", str(cfg), "--port", str(gw)])
    try:
        wait_for_line(proc, rf"gateway on http://127\.0\.0\.1:{gw}/v1")
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{gw}", api_key="sk-test", max_retries=0)
        providers = {}
        for model in ("claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5"):
            raw = client.messages.with_raw_response.create(
                model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
            )
            assert raw.parse().model == model
            providers[model] = raw.headers["x-latgate-provider"]
        metrics = httpx.get(f"http://127.0.0.1:{gw}/metrics").text
    finally:
        proc.send_signal(signal.SIGINT)
        proc.stderr.read()
        assert proc.wait(timeout=20) == 0
    assert providers == {"claude-opus-5-5": "vllm", "claude-sonnet-5-5": "vllm", "claude-haiku-5-5": "tile-rt"}
    for model, provider in providers.items():
        assert f'latgate_requests_total{{code="200",model="{model}",provider="{provider}"}} 1.0' in metrics, model
    assert 'model="other",provider="vllm"} 1.0' not in metrics


def test_demo_reloads_its_config_on_sighup_and_keeps_serving(tmp_path) -> None:
    cfg, gw = bundled_config_on_free_ports(tmp_path)
    url = f"http://127.0.0.1:{gw}"
    demo = GatewayProcess(["--config", str(cfg), "--port", str(gw)], command=[sys.executable, "-m", "latgate", "demo"])
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    try:
        demo.wait_for(rf"gateway on {url}/v1")
        assert httpx.post(url + "/v1/chat/completions", json=chat).headers["x-latgate-provider"] == "vllm"
        cfg.write_text(cfg.read_text().replace('default_route = "vllm"', 'default_route = "tile-rt"'))
        demo.signal(signal.SIGHUP)
        demo.wait_for("SIGHUP: reloading the config")
        line = demo.wait_for(r"reloaded .*config\.toml: providers tile-rt, vllm, taotoken").string
        assert "restart" not in line  # --port pins the listen port
        r = httpx.post(url + "/v1/chat/completions", json=chat)
        assert r.status_code == 200 and r.headers["x-latgate-provider"] == "tile-rt"  # its simulator still runs
        demo.signal(signal.SIGINT)
        assert demo.wait_exit(timeout=20) == 0
    finally:
        demo.stop()
    assert not any("Traceback" in line for line in demo.lines)


def test_serve_reports_a_taken_port_in_one_line(tmp_path) -> None:
    taken = listening_socket()
    port = taken.getsockname()[1]
    cfg = tmp_path / "config.toml"
    cfg.write_text('[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n')
    try:
        result = subprocess.run(
            [sys.executable, "-m", "latgate", "serve", "--config", str(cfg), "--port", str(port)],
            check=False,  # the exit code is the assertion
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        taken.close()
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_a_broken_config_exits_1_with_one_line(tmp_path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('[providers.p]\napi_base = "http://127.0.0.1:9/v1"\nconector = "vllm"\n')
    result = subprocess.run(
        [sys.executable, "-m", "latgate", "serve", "--config", str(cfg)],
        check=False,  # the exit code is the assertion
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "providers.p.conector" in lines[0] and "connector" in lines[0]


def test_serve_answers_and_stops_on_sigterm(tmp_path) -> None:
    (port,) = free_ports(1)
    cfg = tmp_path / "config.toml"
    cfg.write_text('[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n')
    proc = start(["serve", "--config", str(cfg), "--port", str(port)])
    try:
        wait_for_line(proc, rf"listening on http://127\.0\.0\.1:{port}")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code == 502  # nothing listens on the provider's port
        assert "127.0.0.1:9" not in r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down, then re-raises SIGTERM: the conventional "killed by TERM" status
        assert proc.wait(timeout=20) in (0, -signal.SIGTERM)


LIMITED_KEYS = (
    '[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n\n'
    '[[auth.keys]]\nname = "team-a"\nkey = "sk-a"\nrpm = 60\n\n'
    '[[auth.keys]]\nname = "team-b"\nkey = "sk-b"\ntpm = 1000\n\n'
    '[[auth.keys]]\nname = "ops"\nkey = "sk-ops"\n'
)


def lines_until_listening(args: list[str], port: int) -> list[str]:
    """Start ``latgate serve ARGS``, return its stderr lines up to "listening on", stop it."""
    proc = start(["serve", *args, "--port", str(port)])
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if f"listening on http://127.0.0.1:{port}" in line:
                return seen
        raise AssertionError("serve ended without listening:\n" + "".join(seen))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)


def test_serve_with_workers_warns_that_in_process_limits_multiply(tmp_path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(LIMITED_KEYS)
    (port,) = free_ports(1)
    seen = lines_until_listening(["--config", str(cfg), "--workers", "2"], port)
    warned = [line for line in seen if "--workers 2" in line]
    assert len(warned) == 1, warned
    assert "keys team-a, team-b get up to 2x their rpm/tpm" in warned[0] and "ops" not in warned[0]
    assert "[state] redis_url" in warned[0]


@pytest.mark.parametrize(
    ("extra", "workers"),
    [("", "1"), ('\n[state]\nredis_url = "redis://127.0.0.1:9/0"\n', "2")],
    ids=["one-worker", "shared-state"],
)
def test_serve_does_not_warn_of_multiplied_limits_when_they_hold(tmp_path, extra, workers) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(LIMITED_KEYS + extra)
    (port,) = free_ports(1)
    seen = lines_until_listening(["--config", str(cfg), "--workers", workers], port)
    assert not [line for line in seen if "rpm/tpm" in line], seen


def test_demo_drains_a_stream_in_flight_on_sigterm_and_exits_0(tmp_path) -> None:
    """``docker stop`` of the demo: the stream already going finishes whole (its
    simulator keeps answering until the gateway has drained), then the process ends
    with status 0, not uvicorn's re-raised SIGTERM (143)."""
    cfg, gw = bundled_config_on_free_ports(tmp_path)
    url = f"http://127.0.0.1:{gw}"
    demo = GatewayProcess(["--config", str(cfg), "--port", str(gw)], command=[sys.executable, "-m", "latgate", "demo"])
    try:
        demo.wait_for(rf"gateway on {url}/v1")
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 400}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            demo.signal(signal.SIGTERM)
            demo.wait_for(r"draining: SIGTERM received")
            rest = [line for line in lines if line]
        assert first and rest[-1] == "data: [DONE]"
        assert demo.wait_exit(timeout=60) == 0
    finally:
        demo.stop()
    assert not any("Traceback" in line for line in demo.lines)
