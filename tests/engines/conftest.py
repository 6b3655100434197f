"""The engine tier: two real vLLM replicas, and latgate in front of them.

Collected only under ``make test-engines``, which builds the vLLM venv and the model
once (``setup.sh``) and names them in ``LATGATE_VLLM_PYTHON`` / ``LATGATE_VLLM_MODEL``;
plain ``make test`` collects nothing here.

The replicas are started once per session. A test that kills or stops one asks for
:func:`replicas` again through :func:`both_ready`, which restarts what is down.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from stack import Stack, gateway
from vllm_server import VllmReplica, engine_config

VLLM_PYTHON = os.environ.get("LATGATE_VLLM_PYTHON", "")
VLLM_MODEL = os.environ.get("LATGATE_VLLM_MODEL", "")
VLLM_LONG_MODEL = os.environ.get("LATGATE_VLLM_LONG_MODEL", "")
LONG_CONTEXT_TOKENS = 8192

if not (VLLM_PYTHON and VLLM_MODEL):
    collect_ignore_glob = ["test_*.py"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stops_replica: kills or stops a replica (run last: fewer restarts)")
    config.addinivalue_line(
        "markers", "own_replicas: starts replicas of its own (run first, before the shared ones)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests with replicas of their own run first (their replicas are stopped before the
    shared ones start: two vLLM servers at most at once); tests that take a replica
    down run after the others, so the replicas are restarted as few times as possible."""

    def order(item: pytest.Item) -> int:
        if item.get_closest_marker("own_replicas") is not None:
            return 0
        return 2 if item.get_closest_marker("stops_replica") is not None else 1

    items.sort(key=order)


@pytest.fixture(scope="session")
def replicas() -> Iterator[list[VllmReplica]]:
    """Two vLLM servers, one CPU core each, started together."""
    started = [VllmReplica(python=VLLM_PYTHON, model=VLLM_MODEL, core=core) for core in (0, 1)]
    try:
        for replica in started:
            replica.start()
        for replica in started:
            replica.wait_ready()
        yield started
    finally:
        for replica in started:
            with contextlib.suppress(Exception):
                replica.stop()


@pytest.fixture(scope="module")
def cache_replicas() -> Iterator[list[VllmReplica]]:
    """Two replicas of the long-context model (``LATGATE_VLLM_LONG_MODEL``, 8192
    positions) with prefix caching and cached-token details on, one core each, for one
    module: stopped when it is done."""
    if not VLLM_LONG_MODEL:
        pytest.skip("LATGATE_VLLM_LONG_MODEL is not set (make test-engines sets it)")
    args = ("--enable-prefix-caching", "--enable-prompt-tokens-details")
    started = [
        VllmReplica(
            python=VLLM_PYTHON,
            model=VLLM_LONG_MODEL,
            core=core,
            context_tokens=LONG_CONTEXT_TOKENS,
            extra_args=args,
        )
        for core in (0, 1)
    ]
    try:
        for replica in started:
            replica.start()
        for replica in started:
            replica.wait_ready()
        yield started
    finally:
        for replica in started:
            with contextlib.suppress(Exception):
                replica.stop()


@pytest.fixture
def both_ready(replicas: list[VllmReplica]) -> list[VllmReplica]:
    """The two replicas, each restarted first if a previous test took it down."""
    down = [replica for replica in replicas if not replica.alive()]
    for replica in down:
        replica.stop()
        replica.start()
    for replica in down:
        replica.wait_ready()
    return replicas


@pytest.fixture
def stack(both_ready: list[VllmReplica]) -> Iterator[Stack]:
    """latgate (in process, on a free port) in front of both replicas."""
    with gateway(engine_config([replica.url for replica in both_ready])) as running:
        yield running
