"""Gateway stacks on loopback for end-to-end tests: simulators or replay upstreams, a
config pointing at them, and the gateway under uvicorn, each on a free port."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from replay import ReplayScript, ReplayServer, replay_server
from servers import serve_app

from latgate.app.asgi import create_app
from latgate.commands.sim import SimApp, SimOptions, create_sim_app
from latgate.foundation.config import load_config, load_config_text
from latgate.foundation.config.schema import Config
from latgate.request.tracing import Tracing

FAST = {"tpot_ms": 0.5, "tpot_growth_ms": 0.0, "ttft_overhead_ms": 1.0, "default_max_tokens": 16}


@dataclass
class Stack:
    """A running gateway: its base URL, config and the simulators behind it by provider."""

    url: str
    config: Config
    sims: dict[str, SimApp] = field(default_factory=dict)
    app: object = None

    @property
    def v1(self) -> str:
        return self.url + "/v1"


def requests_total(base_url: str, code: str | int, *, provider: str | None = None) -> float:
    """``latgate_requests_total`` for HTTP status ``code``, summed over models and over
    providers (or of ``provider`` only: ``none`` for latgate's own refusals), read from
    the gateway's ``/metrics`` at ``base_url`` (no ``/v1``)."""
    return requests_total_in(httpx.get(base_url + "/metrics", timeout=10).text, code, provider=provider)


def requests_total_in(metrics: str, code: str | int, *, provider: str | None = None) -> float:
    """:func:`requests_total` read from a ``/metrics`` text."""
    wanted = [f'code="{code}"'] + ([] if provider is None else [f'provider="{provider}"'])
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("latgate_requests_total{") and all(label in line for label in wanted)
    )


@contextlib.contextmanager
def gateway(
    config_text: str, *, env: Mapping[str, str] | None = None, tracing: Tracing | None = None
) -> Iterator[Stack]:
    """Serve a gateway for ``config_text`` (TOML), tracing into ``tracing`` when given."""
    env = dict(env or {})
    config = load_config_text(config_text, source="test.config.toml", env=env)
    with _serve(config, env=env, tracing=tracing) as stack:
        yield stack


@contextlib.contextmanager
def gateway_file(path: Path, *, env: Mapping[str, str] | None = None) -> Iterator[Stack]:
    """Serve a gateway for the config file ``path``: ``POST /admin/reload`` (and a
    reload of the app) read that file again, so a test may rewrite it."""
    env = dict(env or {})
    with _serve(load_config(path, env=env), env=env) as stack:
        yield stack


@contextlib.contextmanager
def _serve(config: Config, *, env: dict[str, str], tracing: Tracing | None = None) -> Iterator[Stack]:
    app = create_app(config, env=env, tracing=tracing)
    with serve_app(app) as url:
        yield Stack(url=url, config=config, app=app)


ONE_UPSTREAM_TEMPLATE = """
[defaults]
timeout_sec = 10
connect_timeout_sec = 2
max_retries = 0

[providers.up]
api_base = "{base}"
"""


def one_upstream_config(api_base: str) -> str:
    """A config (TOML) whose only provider, ``up``, is at ``api_base``: no retries, a 10 s
    read timeout and a 2 s connect timeout."""
    return ONE_UPSTREAM_TEMPLATE.format(base=api_base)


@contextlib.contextmanager
def replay_gateway(script: ReplayScript | Sequence[ReplayScript]) -> Iterator[tuple[ReplayServer, Stack]]:
    """A replay upstream answering with ``script`` and a gateway in front of it
    (:func:`one_upstream_config`): ``(upstream, gateway stack)``."""
    with replay_server(script) as upstream, gateway(one_upstream_config(upstream.base_url)) as stack:
        yield upstream, stack


@contextlib.contextmanager
def simulators(options: Mapping[str, SimOptions]) -> Iterator[dict[str, tuple[str, SimApp]]]:
    """One simulator per name: ``{name: (base_url, app)}``."""
    with contextlib.ExitStack() as stack:
        out = {}
        for name, opts in options.items():
            app = create_sim_app(opts)
            out[name] = (stack.enter_context(serve_app(app)), app)
        yield out


def default_route_config(urls: Mapping[str, str], *, default: str) -> str:
    """A config (TOML) with one provider per ``{name: base URL}`` (at ``<base URL>/v1``)
    and ``default`` as the default route."""
    providers = "".join(f'[providers.{name}]\napi_base = "{url}/v1"\n\n' for name, url in urls.items())
    return f'{providers}[routing]\ndefault_route = "{default}"\n'


@contextlib.contextmanager
def simulator_urls(names: Sequence[str]) -> Iterator[dict[str, str]]:
    """One fast simulator (:data:`FAST`) per name: ``{name: base URL}``."""
    with simulators({name: SimOptions(name=name, **FAST) for name in names}) as running:
        yield {name: url for name, (url, _) in running.items()}


DEMO_TEMPLATE = """
[defaults]
timeout_sec = 30
connect_timeout_sec = 2
max_retries = {max_retries}

[providers.tile-rt]
api_base = "{tile}/v1"
connector = "tile_rt_connector"
engine = "tile-rt"
role = "decode"
models = ["glm-5.1"]
max_batch_size = 8
enable_prefix_cache = true

[providers.vllm]
api_base = "{vllm}/v1"
connector = "vllm"
role = "prefill"
models = ["glm-5.1"]

[providers.taotoken]
api_base = "{tao}"
api_key_env = "TAOTOKEN_API_KEY"
role = "upstream"
models = ["glm-5.1", "qwen2.5-72b-instruct"]

[routing]
default_route = "vllm"
default_model = "glm-5.1"
latency_threshold_ms = 200
route_latency_sensitive_to = "tile-rt"
long_context_threshold = 16384
long_context_provider = "vllm"
fallbacks = {{ "tile-rt" = ["vllm", "taotoken"], "vllm" = ["taotoken"] }}

[routing.policies.interactive]
latency_sensitive = true

[aliases]
"glm-5.1-highspeed" = "glm-5.1"
"*" = "glm-5.1"

[models."glm-5.1-highspeed"]
latency_sensitive = true
"""


@contextlib.contextmanager
def demo_stack(
    *,
    tile: SimOptions | None = None,
    vllm: SimOptions | None = None,
    tao: SimOptions | None = None,
    env: Mapping[str, str] | None = None,
    max_retries: int = 1,
) -> Iterator[Stack]:
    """The pool-sections system (decode pool, throughput pool, upstream) on simulators."""
    opts = {
        "tile-rt": tile or SimOptions(name="tile-rt", **FAST),
        "vllm": vllm or SimOptions(name="vllm", **FAST),
        "taotoken": tao or SimOptions(name="taotoken", **FAST),
    }
    with simulators(opts) as sims:
        text = DEMO_TEMPLATE.format(
            tile=sims["tile-rt"][0], vllm=sims["vllm"][0], tao=sims["taotoken"][0] + "/v1", max_retries=max_retries
        )
        with gateway(text, env=env) as stack:
            stack.sims = {name: app for name, (_, app) in sims.items()}
            yield stack


def quiet_access_log() -> None:
    logging.getLogger("latgate.access").setLevel(logging.INFO)


def leave_after_first_content(url: str, body: dict[str, Any]) -> None:
    """POST a streamed ``body`` to ``url``, read until the first chunk with generated
    content, then close the connection (a client leaving mid-stream)."""
    with httpx.Client(timeout=10) as client, client.stream("POST", url, json=body) as response:
        for line in response.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                return
