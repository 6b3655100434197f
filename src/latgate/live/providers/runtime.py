"""One provider at run time: its config, connector, endpoints' live numbers, upstream
auth header and what it learnt of its upstream (whether it takes ``stream_options``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from latgate.foundation.config.schema import ProviderConfig
from latgate.live.connectors import Connector
from latgate.live.providers.endpoint import EndpointRuntime
from latgate.live.providers.stream_options import StreamOptionsSupport
from latgate.transport.egress import Egress


@dataclass(slots=True)
class ProviderRuntime:
    """One provider: its config, connector, endpoints' live numbers and upstream auth header.

    ``auth_headers`` holds ``Authorization: Bearer <key>`` when ``api_key_env`` is set
    in the environment, else nothing. It is never logged nor sent to a client.
    ``turn`` counts the requests routed to it (equal endpoints take turns by it);
    ``budgeted`` / ``explored``: requests with a budget routed to it, and how many of
    those were spent refreshing thin or stale evidence.
    ``stream_options``: whether it takes a stream's ``stream_options``, learnt at run
    time from refusals (:mod:`latgate.live.providers.stream_options`).
    """

    config: ProviderConfig
    connector: Connector
    endpoints: list[EndpointRuntime]
    auth_headers: dict[str, str] = field(default_factory=dict)
    turn: int = 0
    budgeted: int = 0
    explored: int = 0
    stream_options: StreamOptionsSupport = field(default_factory=StreamOptionsSupport)
    egress: Egress | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def carry_from(self, previous: ProviderRuntime) -> None:
        """Take over what ``previous`` (the same provider before a reload) learnt at run
        time: whether it takes ``stream_options``, its request counters. The smooth
        round-robin credit starts afresh (its endpoints may have changed)."""
        self.stream_options = previous.stream_options
        self.turn, self.budgeted, self.explored = previous.turn, previous.budgeted, previous.explored
