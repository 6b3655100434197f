"""Least outstanding: the endpoint with the fewest requests in flight."""

from __future__ import annotations

from latgate.routing.policies.view import EndpointView, usable


def choose_least_outstanding(views: list[EndpointView], *, turn: int) -> int:
    """The index of the available view with the fewest in flight per unit of weight; ties go to the first
    at or after ``turn`` (mod the count), so equal endpoints take turns.

    Example::

        choose_least_outstanding([EndpointView(in_flight=3), EndpointView(in_flight=1)], turn=0)  # 1
    """
    count = len(views)
    candidates = set(usable(views))
    best = -1
    for step in range(count):
        index = (turn + step) % count
        if index in candidates and (
            best < 0 or views[index].in_flight / views[index].weight < views[best].in_flight / views[best].weight
        ):
            best = index
    return best
