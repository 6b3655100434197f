"""The interface every strategy implements (:class:`Strategy`); the package docstring
(:mod:`latgate.routing.strategies`) says how the selector uses it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from latgate.live.providers import EndpointRuntime, ProviderRuntime, Ticket
    from latgate.routing.plan import RoutePlan
    from latgate.routing.policies.view import EndpointView


@dataclass(frozen=True, slots=True)
class Choice:
    """What a strategy chooses an endpoint from.

    Attributes:
        runtime: the provider whose endpoint is chosen (more than one endpoint).
        views: snapshots of ``runtime``'s endpoints, in order.
        plan: the request's plan so far (prompt tokens, prefix, budget).
        commit: the request is really sent; False: an explanation only, no state
            changes.
        trial_ok: the request may be a half-open endpoint's trial.
        explore: it may refresh an endpoint with thin or stale evidence.
    """

    runtime: ProviderRuntime
    views: list[EndpointView]
    plan: RoutePlan
    commit: bool
    trial_ok: bool = False
    explore: bool = False


class Strategy:
    """One ``routing.strategy``: its choice and the state it keeps.

    Attributes:
        name: the strategy's name (aliases resolved, :mod:`.registry`).
        predicts: it routes on live predictions: the selector fills the snapshots'
            predicted TTFT, and overflows, hedges and ejects slow endpoints for it.
    """

    name = ""
    predicts = False

    def choose(self, choice: Choice) -> int:
        """The index in ``choice.views`` of the endpoint that takes the request."""
        raise NotImplementedError

    def on_first_token(self, endpoint: EndpointRuntime, ticket: Ticket) -> None:
        """An attempt on ``endpoint`` produced its first token (the engine now holds
        its prompt)."""
