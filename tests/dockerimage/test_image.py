"""The gateway's image built and run on a real Docker engine (``make test-docker``
starts dockerd with host networking only and makes the base image with debootstrap;
see .ci/docker-engine). The container runs with ``--network host`` in front of
simulators on 127.0.0.1 and is checked: it runs as the non-root user, its HEALTHCHECK
turns healthy with a mounted config on another port than 8000 (the check reads the
address from that config), a streamed request works, ``/metrics`` answers, and SIGTERM lets a
stream in flight finish before the process exits 0. The image's size is written to
build/artifacts/docker.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import poll
from redisd import free_port
from stack import FAST, simulators

from latgate.commands.sim import SimOptions

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "artifacts"
BASE_IMAGE = os.environ.get("BASE_IMAGE", "latgate-base:bookworm")
IMAGE = "latgate:tier"
CA_BUNDLE = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
BODY = {"model": "glm-5.1", "messages": [{"role": "user", "content": "hello"}], "stream": True}
CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
[defaults]
max_retries = 0
[providers.tile-rt]
api_base = "{tile}/v1"
role = "decode"
models = ["glm-5.1"]
[providers.vllm]
api_base = "{vllm}/v1"
role = "prefill"
models = ["glm-5.1"]
[routing]
default_route = "vllm"
route_latency_sensitive_to = "tile-rt"
"""


def docker(*args: str, timeout: float = 60, check: bool = True) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert result.returncode == 0, f"docker {' '.join(args)}: {result.stderr[-2000:]}"
    return result.stdout.strip()


def report(line: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with (ARTIFACTS / "docker.md").open("a") as out:
        out.write(line + "\n")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    """The image built from the repository's tracked files on the cached base image."""
    (ARTIFACTS / "docker.md").unlink(missing_ok=True)
    assert shutil.which("docker"), "docker is not installed: `make test-docker` installs docker.io"
    docker("image", "inspect", BASE_IMAGE)  # made by `.ci/docker-engine base`
    context = tmp_path_factory.mktemp("context")
    for name in ("pyproject.toml", "README.md", "src", "docker"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, context / name)
    args = ["build", "--network", "host", "-f", str(context / "docker" / "Dockerfile"), "-t", IMAGE, "--build-arg", f"BASE_IMAGE={BASE_IMAGE}"]
    if CA_BUNDLE.is_file():  # the machine's CA bundle, for pip behind its egress proxy
        shutil.copy2(CA_BUNDLE, context / "docker" / "build-ca.pem")
        args += ["--build-arg", "PIP_CERT=/src/build-ca.pem"]
    started = time.monotonic()
    result = subprocess.run(
        ["docker", *args, str(context)], capture_output=True, text=True, timeout=900, check=False, env={**os.environ, "DOCKER_BUILDKIT": "0"}
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    size = int(docker("image", "inspect", "-f", "{{.Size}}", IMAGE))
    report(f"- image `{IMAGE}` on `{BASE_IMAGE}`: {size / 1e6:.0f} MB, built in {time.monotonic() - started:.0f} s")
    return IMAGE


@pytest.fixture(scope="module")
def running(image: str, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """``(container name, gateway URL)``: the image serving a config that points at two
    simulators on loopback (the tile-rt one streams slowly enough to be caught by SIGTERM)."""
    options = {
        "tile-rt": SimOptions(name="tile-rt", tpot_ms=20.0, tpot_growth_ms=0.0, ttft_overhead_ms=1.0, default_max_tokens=100),
        "vllm": SimOptions(name="vllm", **FAST),
    }
    with simulators(options) as sims:
        port = free_port()
        config = tmp_path_factory.mktemp("config") / "config.toml"
        config.write_text(CONFIG.format(port=port, tile=sims["tile-rt"][0], vllm=sims["vllm"][0]))
        config.chmod(0o644)
        name = f"latgate-tier-{uuid.uuid4().hex[:8]}"
        docker(
            "run", "-d", "--name", name, "--network", "host",
            "--health-interval", "1s", "--health-start-period", "1s",  # the image's check, polled sooner
            "-v", f"{config}:/etc/latgate/config.toml:ro", image,
        )
        try:
            yield name, f"http://127.0.0.1:{port}"
        finally:
            logs = docker("logs", name, check=False)
            (ARTIFACTS / "docker-latgate.log").write_text(logs)
            docker("rm", "-f", name, check=False)


def test_the_container_runs_as_the_non_root_user(running) -> None:
    name, _ = running
    assert docker("exec", name, "id", "-u") == "10001"
    assert docker("inspect", "-f", "{{.Config.User}}", name) == "10001:10001"
    report("- runs as uid 10001 (non-root)")


def test_the_healthcheck_turns_healthy(running) -> None:
    name, _ = running
    poll(lambda: docker("inspect", "-f", "{{.State.Health.Status}}", name) == "healthy", timeout=60, what="healthy")
    report("- HEALTHCHECK: healthy (config port, no LATGATE_HEALTHCHECK_URL)")


def test_a_streamed_request_works_and_metrics_answer(running) -> None:
    _, url = running
    poll(lambda: _answers(url + "/readyz"), timeout=30, what="the gateway to be ready")
    response = httpx.post(url + "/v1/chat/completions", json={**BODY, "max_tokens": 8}, timeout=30)
    assert response.status_code == 200 and response.text.rstrip().endswith("data: [DONE]")
    assert response.headers["x-latgate-provider"] == "vllm"
    metrics = httpx.get(url + "/metrics", timeout=10)
    assert metrics.status_code == 200
    assert 'latgate_requests_total{code="200",model="glm-5.1",provider="vllm"}' in metrics.text or 'provider="vllm"' in metrics.text
    report("- a streamed request through the container: 200, ends with [DONE]; /metrics answers")


def test_sigterm_drains_a_stream_in_flight_then_exits_0(running) -> None:
    name, url = running
    poll(lambda: _answers(url + "/readyz"), timeout=30, what="the gateway to be ready")
    with httpx.Client(timeout=30) as client, client.stream(
        "POST", url + "/v1/chat/completions", json=BODY, headers={"X-Latency-Sensitive": "1"}
    ) as response:
        assert response.headers["x-latgate-provider"] == "tile-rt"
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        docker("kill", "--signal", "TERM", name)
        rest = list(lines)
    assert rest[-1] == "data: [DONE]" or rest[-2:] == ["data: [DONE]", ""] or "data: [DONE]" in rest
    assert docker("wait", name, timeout=60) == "0"
    report("- SIGTERM during a stream: the stream finished with [DONE], the container exited 0")


def test_compose_file_is_valid_where_the_plugin_exists() -> None:
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        report("- docker compose: plugin not installed here, compose.yaml not validated by Docker")
        pytest.skip("the docker compose plugin is not installed")
    docker("compose", "-f", str(ROOT / "docker" / "compose.yaml"), "config", "-q")
    report("- docker compose config: valid")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
