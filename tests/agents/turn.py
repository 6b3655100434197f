"""One agent turn against a latgate in front of simulators: the gateway stack, and the
glue from install to result."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from agents.install import PINS, install
from agents.recorder import RecordingApp, Seen
from agents.run import AgentRun, run_agent
from agents.sandbox import Sandbox
from agents.setups import SETUPS, SHELL_TOOLS
from prometheus_client.parser import text_string_to_metric_families
from servers import serve_app
from stack import simulators

from latgate.app.asgi import create_app
from latgate.commands.sim import SimApp, SimOptions
from latgate.foundation.config import load_config_text

PREPARE_TIMEOUT_SECONDS = 60
#: Fast simulated engines: agents send 5-30k-token prompts; a turn should take seconds.
AGENT_SIM = {
    "prefill_tokens_per_second": 2_000_000.0,
    "ttft_overhead_ms": 1.0,
    "tpot_ms": 0.5,
    "tpot_growth_ms": 0.0,
    "default_max_tokens": 12,
    "max_output_tokens": 24,
    "preferred_tools": SHELL_TOOLS,
}

#: The pool-sections system (decode pool, throughput pool, hosted upstream), long-context rule
#: out of the way so each agent's model decides its provider:
#: ``glm-5.1-highspeed`` -> tile-rt (latency-sensitive), ``qwen2.5-72b-instruct`` ->
#: taotoken (the only provider serving it), anything else (``glm-5.1``, Claude and GPT
#: names, through the catch-all alias) -> the default route, vllm.
CONFIG = """
[defaults]
timeout_sec = 60
connect_timeout_sec = 2
max_retries = 0

[providers.tile-rt]
api_base = "{tile}/v1"
connector = "tile_rt_connector"
role = "decode"
models = ["glm-5.1"]

[providers.vllm]
api_base = "{vllm}/v1"
connector = "vllm"
role = "prefill"
models = ["glm-5.1"]

[providers.taotoken]
api_base = "{tao}/v1"
api_key_env = "TAOTOKEN_API_KEY"
role = "upstream"
models = ["glm-5.1", "qwen2.5-72b-instruct"]

[routing]
default_route = "vllm"
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
long_context_threshold = 1000000
long_context_provider = "vllm"

[aliases]
"glm-5.1-highspeed" = "glm-5.1"
# Claude Code asks for its own claude-* names: the catch-all serves them as glm-5.1.
"*" = "glm-5.1"

[models."glm-5.1-highspeed"]
latency_sensitive = true
"""


@dataclass
class AgentStack:
    """A running latgate (``url``) recording what reaches it, with its simulators by provider."""

    url: str
    recorder: RecordingApp
    sims: dict[str, SimApp]

    def requests_total(self) -> dict[tuple[str, str], float]:
        """``latgate_requests_total`` by (provider, code), read from ``/metrics``."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "latgate_requests_total":
                    key = (sample.labels["provider"], sample.labels["code"])
                    out[key] = out.get(key, 0.0) + sample.value
        return out


@contextlib.contextmanager
def agent_stack() -> Iterator[AgentStack]:
    """latgate with the three pool-sections providers, each a fast simulator."""
    names = ("tile-rt", "vllm", "taotoken")
    with simulators({name: SimOptions(name=name, **AGENT_SIM) for name in names}) as sims:
        text = CONFIG.format(tile=sims["tile-rt"][0], vllm=sims["vllm"][0], tao=sims["taotoken"][0])
        env = {"TAOTOKEN_API_KEY": "sk-simulated"}
        recorder = RecordingApp(
            create_app(load_config_text(text, source="agents.config.toml", env=env), env=env)
        )
        with serve_app(recorder) as url:
            yield AgentStack(url=url, recorder=recorder, sims={name: app for name, (_, app) in sims.items()})


@dataclass(frozen=True)
class Turn:
    """One agent turn: the run, and what reached latgate."""

    agent: str
    run: AgentRun
    seen: list[Seen]


def run_turn(
    agent: str, *, stack: AgentStack, root: Path, model: str, timeout_seconds: float, follow_up: bool = False
) -> Turn:
    """Install (cached) ``agent``, set it up in a sandbox under ``root`` and run one turn;
    with ``follow_up``, then a second turn of the same session where the CLI can resume
    one (``AgentCommand.follow_up``; its failure is the turn's result).

    Raises:
        AgentUnavailable: the CLI cannot be installed here.
        AssertionError: a preparation command failed.
    """
    command = install(PINS[agent])
    sandbox = Sandbox.create(root)
    setup = SETUPS[agent](sandbox, command=command, base_url=stack.url, model=model)
    env = sandbox.env(setup.env)
    for argv in setup.prepare:
        prepared = run_agent(argv, sandbox=sandbox, env=env, timeout_seconds=PREPARE_TIMEOUT_SECONDS)
        assert prepared.returncode == 0, prepared.summary()
    start = len(stack.recorder.seen)
    run = run_agent(setup.turn, sandbox=sandbox, env=env, timeout_seconds=timeout_seconds)
    if follow_up and setup.follow_up and run.returncode == 0:
        first = run
        run = run_agent(setup.follow_up, sandbox=sandbox, env=env, timeout_seconds=timeout_seconds)
        run = dataclasses.replace(
            run, started_at=first.started_at, seconds=run.started_at + run.seconds - first.started_at
        )
    return Turn(agent=agent, run=run, seen=stack.recorder.seen[start:])


def timing(turn: Turn) -> str:
    """Where the turn's time went: start-up before the first request, the requests, and
    the exit after the last one."""
    if not turn.seen:
        return f"{turn.run.seconds:.1f}s, no request reached latgate"
    first = turn.seen[0].at - turn.run.started_at
    last = turn.seen[-1].at - turn.run.started_at
    return (
        f"{turn.run.seconds:.1f}s: first request after {first:.1f}s, last after {last:.1f}s, "
        f"exit {turn.run.seconds - last:.1f}s later"
    )
