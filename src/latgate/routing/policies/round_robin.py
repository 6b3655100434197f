"""Round robin: endpoints in turn, skipping those that cannot take traffic."""

from __future__ import annotations

from latgate.routing.policies.view import EndpointView


def choose_round_robin(views: list[EndpointView], *, turn: int) -> int:
    """The index of the first available view at or after ``turn`` (mod the count).

    ``turn`` is the caller's counter, advanced once per request. When no view is
    available, ``turn`` itself (mod the count).

    Example::

        choose_round_robin([EndpointView(), EndpointView(available=False), EndpointView()], turn=1)  # 2
    """
    count = len(views)
    for step in range(count):
        index = (turn + step) % count
        if views[index].available:
            return index
    return turn % count
