"""Fixtures shared by every test module (pytest finds them here, no import needed).

Plain helpers live in the modules beside this file and are imported by name, as
top-level modules (``pythonpath`` in pyproject.toml): ``stack`` (a gateway on loopback
in front of simulators or replay upstreams), ``completions`` (chat request bodies, the
upstream's answer and its SSE chunks), ``replay``, ``servers``, ``h1_upstreams`` ...
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from redisd import redis_server
from stack import Stack, demo_stack


@pytest.fixture(scope="module")
def demo() -> Iterator[Stack]:
    """The bundled demo system (:func:`stack.demo_stack`: a decode pool, a throughput pool
    and a hosted upstream, all simulators) behind a gateway, one per test module. A
    module that needs other simulator options defines its own ``demo``."""
    with demo_stack() as stack:
        yield stack


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A real redis-server (:func:`redisd.redis_server`), one per test module: its URL."""
    with redis_server() as url:
        yield url


@pytest.fixture
def flushed(redis_url: str) -> str:
    """The module's redis-server emptied (``FLUSHALL``) before the test: its URL."""

    async def flush() -> None:
        client = Redis.from_url(redis_url)
        await client.flushall()
        await client.aclose()

    asyncio.run(flush())
    return redis_url
