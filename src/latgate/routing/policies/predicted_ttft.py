"""Power of two choices by predicted time to first token.

Comparing every endpoint sends each burst to whichever looked best a moment ago (the
herd effect); comparing two drawn at random spreads load almost as well as full
knowledge would (Mitzenmacher, "The Power of Two Choices in Randomized Load
Balancing", 2001). With two endpoints both are compared.
"""

from __future__ import annotations

from latgate.routing.policies.view import EndpointView, usable


def choose_power_of_two(
    views: list[EndpointView], *, draws: tuple[int, int], trial_first: bool = True
) -> int:
    """The index of the better of two available views (lower predicted TTFT, then fewer in
    flight, then the earlier one).

    Args:
        views: the provider's endpoints.
        draws: two non-negative random integers choosing the pair when there are more
            than two candidates.
        trial_first: a view on trial (half-open) is chosen before any other, so a
            recovered endpoint is found out with the first request after its time out;
            when False (a request that cannot risk it), views on trial are passed over
            while another is available.

    Example::

        views = [EndpointView(predicted_ttft_ms=80.0), EndpointView(predicted_ttft_ms=20.0)]
        choose_power_of_two(views, draws=(0, 0))  # 1
    """
    candidates = usable(views)
    if trial_first:
        for index in candidates:
            if views[index].trial and views[index].available:
                return index
    else:
        candidates = [i for i in candidates if not views[i].trial] or candidates
    if len(candidates) > 2:
        first = draws[0] % len(candidates)
        second = draws[1] % (len(candidates) - 1)
        if second >= first:
            second += 1
        candidates = sorted((candidates[first], candidates[second]))
    best = candidates[0]
    for index in candidates[1:]:
        view, other = views[index], views[best]
        if (view.predicted_ttft_ms, view.in_flight) < (other.predicted_ttft_ms, other.in_flight):
            best = index
    return best
