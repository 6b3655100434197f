"""Start-up for the scenario benchmarks: simulators, ``latgate serve`` and the peers on
loopback, each a child process killed on exit (re-exported by ``benchmarks/harness.py``).

    .venv/bin/python benchmarks/startup.py --serve-sims SPEC   (the simulators' child process)

Imports no other benchmark module than ``serving`` and ``peers``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import PEERS, wait_port
from serving import free_port, latgate_serve_command, serve_apps

LATGATE_SYSTEMS = ("latgate", "round_robin", "least_outstanding")
"""latgate's strategies, each a system of the routing scenarios."""
PEER_SYSTEMS = ("litellm", "vllm-router")
MODEL = "m"
"""The model name the peers' configs and warm-up requests use."""


# -- simulators, routers ---------------------------------------------------------------------------------


def serve_sims(spec: dict[str, Any]) -> None:
    """Child process: each simulator of ``spec`` (name -> [port, SimOptions fields]) on one
    event loop, with ``GET /bench/arrivals`` (JSON list of the ``time.monotonic()`` times
    of its chat requests) and ``POST /bench/options`` (a JSON object of SimOptions fields
    set on its engine from then on); a ``slow_first`` field ``[n, ms]`` delays its first
    ``n`` chat requests by ``ms`` before they reach the engine."""
    from latgate.commands.sim import SimOptions, create_sim_app

    def controlled(app: Any, slow_first: tuple[int, float] | None) -> Any:
        arrivals: list[float] = []

        async def wrapped(scope: dict, receive: Any, send_: Any) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and path.startswith("/bench/"):
                if path == "/bench/arrivals":
                    body = orjson.dumps(arrivals)
                else:
                    chunks = []
                    while True:
                        message = await receive()
                        chunks.append(message.get("body", b""))
                        if not message.get("more_body"):
                            break
                    fields = orjson.loads(b"".join(chunks))
                    app.engine.options = dataclasses.replace(app.engine.options, **fields)
                    body = b"{}"
                await send_({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
                await send_({"type": "http.response.body", "body": body})
                return
            if scope["type"] == "http" and path.endswith("/chat/completions"):
                arrivals.append(time.monotonic())
                if slow_first is not None and len(arrivals) <= slow_first[0]:
                    await asyncio.sleep(slow_first[1] / 1000.0)
            await app(scope, receive, send_)

        return wrapped

    apps = {}
    for name, (port, fields) in spec.items():
        fields = dict(fields)
        slow_first = fields.pop("slow_first", None)
        apps[port] = controlled(create_sim_app(SimOptions(name=name, seed=1, **fields)), slow_first)
    serve_apps(apps)


def child_env(system: str = "latgate") -> dict[str, str]:
    """The environment of a child process: latgate's source on the path, and LiteLLM's
    settings for a quiet, offline proxy when ``system`` is ``litellm``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if system.startswith("litellm"):
        env.update(
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            LITELLM_LOG="ERROR",
            LITELLM_TELEMETRY="False",
            LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true",
        )
    return env


def wait_until_up(url: str, *, seconds: float = 20.0) -> None:
    """Poll ``url`` until it answers 200 (process start-up; not part of any measurement).
    Raises RuntimeError after ``seconds``."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up within {seconds:.0f} s")


def wait_routes(base: str, *, seconds: float = 60.0) -> None:
    """Poll a peer until a small chat request succeeds (its workers are registered).
    Raises RuntimeError after ``seconds``."""
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "warm"}], "max_tokens": 1}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(base + "/v1/chat/completions", json=body, timeout=5.0).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{base} routes no request after {seconds:.0f} s")


def fill(template: str, values: dict[str, str]) -> str:
    """``template`` with each ``{name}`` of ``values`` replaced, then ``{{``/``}}`` as
    literal braces (the TOML templates of the scenarios)."""
    for name, value in values.items():
        template = template.replace("{" + name + "}", value)
    return template.replace("{{", "{").replace("}}", "}")


def peer_missing(system: str) -> str | None:
    """Why the peer ``system`` cannot run here, or None."""
    binary = PEERS / system / "bin" / system
    return None if binary.exists() else "not installed (benchmarks/setup_peers.sh)"


def peer_command(system: str, urls: list[str], port: int, tmp: Path, *, policy: str | None = None) -> list[str]:
    """The command line of peer ``system`` (``litellm`` or ``vllm-router``) on ``port`` in
    front of ``urls``; ``policy``: vllm-router's ``--policy`` (default ``power_of_two``) or
    LiteLLM's ``routing_strategy`` (default ``latency-based-routing``). LiteLLM's config
    is written into ``tmp``. Raises ValueError for another system."""
    if system == "vllm-router":
        return [str(PEERS / "vllm-router" / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--policy", policy or "power_of_two", "--worker-urls", *urls]  # fmt: skip
    if system != "litellm":
        raise ValueError(f"unknown peer {system!r}")
    entries = "".join(
        f"  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
        f"      api_base: {url}/v1\n      api_key: sk-bench\n"
        for url in urls
    )
    (tmp / "litellm.yaml").write_text(
        "model_list:\n" + entries + f"router_settings:\n  routing_strategy: {policy or 'latency-based-routing'}\n"
        "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
        "general_settings:\n  disable_spend_logs: true\n"
    )
    return [str(PEERS / "litellm" / "bin" / "litellm"), "--config", str(tmp / "litellm.yaml"),
            "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]  # fmt: skip


def _stop(process: subprocess.Popen | None) -> None:
    if process is not None:
        process.kill()
        process.wait()


@contextlib.contextmanager
def simulators(sims: dict[str, dict[str, Any]], *, up_timeout_s: float = 20.0) -> Iterator[dict[str, str]]:
    """Fresh simulators (``{name: SimOptions fields}``, plus ``slow_first``) in one child
    process, killed on exit; yields ``{name: base URL}`` once each ``/health`` answers."""
    spec = {name: (free_port(), fields) for name, fields in sims.items()}
    urls = {name: f"http://127.0.0.1:{port}" for name, (port, _) in spec.items()}
    child = subprocess.Popen([sys.executable, __file__, "--serve-sims", json.dumps(spec)], env=child_env())
    try:
        for url in urls.values():
            wait_until_up(url + "/health", seconds=up_timeout_s)
        yield urls
    finally:
        _stop(child)


@contextlib.contextmanager
def router(
    system: str, urls: list[str], *, config: str | None = None, policy: str | None = None, up_timeout_s: float = 20.0
) -> Iterator[str]:
    """``latgate serve`` with ``config`` (TOML text; needed unless ``system`` is a peer)
    or the peer ``system`` (``policy`` as :func:`peer_command`) in front of ``urls``,
    killed on exit; yields its base URL once latgate's ``/readyz`` answers or the peer
    routes a request. Peers' logs are discarded (they log every request)."""
    port = free_port()
    process = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if system in PEER_SYSTEMS:
                command = peer_command(system, urls, port, Path(tmp), policy=policy)
                process = subprocess.Popen(command, env=child_env(system), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                wait_port(port, timeout=max(up_timeout_s, 120.0), proc=process)
                wait_routes(f"http://127.0.0.1:{port}", seconds=max(up_timeout_s, 60.0))
            else:
                if config is None:
                    raise ValueError(f"{system!r} is latgate and needs its config")
                path = Path(tmp) / "config.toml"
                path.write_text(config)
                process = subprocess.Popen(latgate_serve_command(path, port=port, log_level="warning"), env=child_env())
                wait_until_up(f"http://127.0.0.1:{port}/readyz", seconds=up_timeout_s)
            yield f"http://127.0.0.1:{port}"
        finally:
            _stop(process)


@contextlib.contextmanager
def sims_and_gateway(
    sims: dict[str, dict[str, Any]], config: str, *, up_timeout_s: float = 20.0
) -> Iterator[tuple[str, dict[str, str]]]:
    """Fresh simulators and a ``latgate serve`` in front of them, killed on exit.

    Args:
        sims: ``{name: SimOptions fields}``; each gets a free port.
        config: the gateway's TOML with ``{name}`` where a simulator's base URL goes
            (``{{``/``}}`` for literal braces).

    Yields:
        (gateway base URL, ``{name: simulator base URL}``), once every ``/health`` and
        the gateway's ``/readyz`` answer 200.
    """
    with (
        simulators(sims, up_timeout_s=up_timeout_s) as urls,
        router("latgate", list(urls.values()), config=fill(config, urls), up_timeout_s=up_timeout_s) as base,
    ):
        yield base, urls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-sims", required=True, metavar="SPEC", help="JSON {name: [port, SimOptions fields]}")
    args = parser.parse_args(argv)
    serve_sims(json.loads(args.serve_sims))
    return 0


if __name__ == "__main__":
    sys.exit(main())
