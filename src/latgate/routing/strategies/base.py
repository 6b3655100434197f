"""The interface every strategy implements (:class:`Strategy`); the package docstring
(:mod:`latgate.routing.strategies`) says how the selector uses it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from latgate.providers import EndpointRuntime, ProviderRuntime, Ticket
    from latgate.routing.plan import RoutePlan
    from latgate.routing.policies.view import EndpointView


class Strategy:
    """One ``routing.strategy``: its choice and the state it keeps.

    Attributes:
        name: the strategy's name (aliases resolved, :mod:`.registry`).
        predicts: it routes on live predictions: the selector fills the snapshots'
            predicted TTFT, and overflows, hedges and ejects slow endpoints for it.
    """

    name = ""
    predicts = False

    def choose(
        self,
        runtime: ProviderRuntime,
        views: list[EndpointView],
        plan: RoutePlan,
        *,
        commit: bool,
        trial_ok: bool = False,
        explore: bool = False,
    ) -> int:
        """The index in ``views`` (``runtime``'s endpoints, more than one) of the
        endpoint that takes the request; ``commit`` False: an explanation only, no
        state changes. ``trial_ok``: the request may be a half-open endpoint's trial;
        ``explore``: it may refresh an endpoint with thin or stale evidence."""
        raise NotImplementedError

    def on_first_token(self, endpoint: EndpointRuntime, ticket: Ticket) -> None:
        """An attempt on ``endpoint`` produced its first token (the engine now holds
        its prompt)."""
