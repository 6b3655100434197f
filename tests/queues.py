"""The gateway queue's test setups, shared by its plain-data and end-to-end tests: a
provider pool with its queue on a hand-moved clock, one simulated pool behind a gateway,
and polling an admin view until it says what the test waits for."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from clocks import ManualClock
from processes import poll as poll_every
from stack import Stack, gateway, simulators

from latgate.commands.sim import SimOptions
from latgate.foundation.config import Config, load_config_text
from latgate.foundation.metrics import Metrics
from latgate.live.providers import ProviderPool
from latgate.routing.admission import Admission
from latgate.routing.decision import Router

T = TypeVar("T")

# a vLLM-style pool of one batch slot at an address nothing answers (plain-data tests);
# a test adds its own [routing] keys and sections below it
ONE_SLOT_POOL = """
[providers.vllm]
api_base = "http://127.0.0.1:9/v1"
models = ["m"]
max_batch_size = 1

[routing]
default_route = "vllm"
"""


@dataclass
class QueuedPool:
    """A provider pool and its gateway queue on one :class:`ManualClock` (seconds, at 0)."""

    config: Config
    clock: ManualClock
    metrics: Metrics
    pool: ProviderPool
    admission: Admission
    router: Router


def queued_pool(text: str, *, enabled: bool = True, lease_seconds: float | None = None) -> QueuedPool:
    """The config ``text`` loaded into a pool, a router and the gateway queue (on when
    ``enabled``), all on one clock; with ``lease_seconds``, every endpoint's requests as if
    seen holding a slot that long (else the queue's prior)."""
    config = load_config_text(text, source="test.toml")
    clock = ManualClock(0.0)
    metrics = Metrics(providers=config.providers, models=["m"])
    pool = ProviderPool(config, metrics=metrics, env={}, clock=clock)
    admission = Admission(pool=pool, metrics=metrics, settings=config.routing.queue, enabled=enabled, timer=clock)
    if lease_seconds is not None:
        for runtime in pool.providers.values():
            for endpoint in runtime.endpoints:
                admission.outlook.leases[endpoint.key] = lease_seconds
    return QueuedPool(config, clock, metrics, pool, admission, Router(config))


@contextlib.contextmanager
def simulated_pool(template: str, sim: SimOptions, **fields: str) -> Iterator[Stack]:
    """One simulator behind a gateway whose config is ``template`` formatted with the
    simulator's ``url`` and ``fields``; ``stack.sims`` maps ``sim.name`` to its app."""
    with simulators({sim.name: sim}) as sims:
        url, app = sims[sim.name]
        with gateway(template.format(url=url, **fields)) as stack:
            stack.sims = {sim.name: app}
            yield stack


@contextlib.contextmanager
def held_streams(
    url: str, body: dict[str, Any], count: int = 1, *, headers: dict[str, str] | None = None
) -> Iterator[list[httpx.Response]]:
    """``count`` streamed requests of ``body`` POSTed to ``url``, each held open after
    its first line (its slot taken) until the block ends: their responses."""
    with httpx.Client(timeout=30) as client, contextlib.ExitStack() as stack:
        responses, lines = [], []
        for _ in range(count):
            response = stack.enter_context(client.stream("POST", url, json=body, headers=headers or {}))
            iterator = response.iter_lines()
            next(iterator)
            responses.append(response)
            lines.append(iterator)  # kept: a dropped iterator closes its response
        yield responses


def poll(condition: Callable[[], T], *, seconds: float = 15.0) -> T:
    """The condition's first truthy value, polled every 10 ms for at most ``seconds``
    (AssertionError after): for admin views that change within one request."""
    return poll_every(condition, timeout=seconds, what="the condition", interval=0.01)
