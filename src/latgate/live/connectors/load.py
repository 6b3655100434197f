"""What an engine says about its own load, and the parsers connectors read it with."""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSION_SUFFIX = re.compile(r"/v\d+(?:beta\d*|alpha\d*)?$")


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One read of an engine's load (any field may be unknown: None).

    Attributes:
        running: requests holding a batch slot (TileRT: busy decode nodes).
        waiting: requests queued for one.
        capacity: slots the engine says it has (TileRT: its decode nodes), which
            replaces the configured ``max_batch_size`` hint.
    """

    running: int | None = None
    waiting: int | None = None
    capacity: int | None = None


def parse_gauges(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum each named metric's samples in Prometheus text exposition format.

    Lines are ``name{labels} value [timestamp]`` or ``name value``; comments and other
    metrics are skipped, as are unparsable values. Names never seen are absent.

    Example::

        parse_gauges('vllm:num_requests_running{model_name="m"} 3.0\\n', ("vllm:num_requests_running",))
        # {'vllm:num_requests_running': 3.0}
    """
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        for name in names:
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
                rest = line[len(name) :]
                if rest[0] == "{":
                    rest = rest[rest.rfind("}") + 1 :]
                parts = rest.split()
                try:
                    value = float(parts[0])
                except (IndexError, ValueError):
                    break
                totals[name] = totals.get(name, 0.0) + value
                break
    return totals


def root_url(base_url: str) -> str:
    """The server root of a versioned base URL (``http://h:1/v1`` -> ``http://h:1``)."""
    return _VERSION_SUFFIX.sub("", base_url)
