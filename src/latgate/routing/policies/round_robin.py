"""Round robin: endpoints in turn by weight, skipping those that cannot take traffic."""

from __future__ import annotations

from collections.abc import Sequence

from latgate.routing.policies.view import EndpointView, usable


def choose_round_robin(views: list[EndpointView], *, credit: Sequence[float]) -> tuple[int, list[float]]:
    """Smooth weighted round robin: the chosen view's index and the credits to pass next time.

    ``credit`` holds one running number per view (all 0.0 to start; any other length
    starts afresh). Each available view earns its ``weight``; the one with the most
    credit is chosen (the first on a tie) and pays back the weights of all that earned.
    Over ``sum(weights)`` turns each view is chosen ``weight`` times, interleaved
    rather than in a run; equal weights take strict turns. When no view is available,
    all take part (a last resort beats refusing: an open circuit may have recovered).

    Source: nginx's upstream round robin (``ngx_http_upstream_get_peer`` in
    ``src/http/ngx_http_upstream_round_robin.c``: ``current_weight += effective_weight``,
    the best pays ``total``); Envoy's round robin likewise honours endpoint weights.

    Example::

        views = [EndpointView(weight=3), EndpointView()]
        credit: list[float] = []
        for _ in range(4):
            index, credit = choose_round_robin(views, credit=credit)  # 0, 0, 1, 0
    """
    earned = list(credit) if len(credit) == len(views) else [0.0] * len(views)
    total = 0.0
    best = -1
    for index in usable(views):
        earned[index] += views[index].weight
        total += views[index].weight
        if best < 0 or earned[index] > earned[best]:
            best = index
    earned[best] -= total
    return best, earned
