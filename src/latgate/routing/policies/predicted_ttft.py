"""Power of two choices by predicted time to first token (for a request with a TTFT
budget: by predicted e2e latency among the endpoints predicted to meet the budget),
with load deciding between endpoints whose predictions are close.

Comparing every endpoint sends each burst to whichever looked best a moment ago (the
herd effect); comparing two drawn at random spreads load almost as well as full
knowledge would (Mitzenmacher, "The Power of Two Choices in Randomized Load
Balancing", 2001). With two endpoints both are compared.

Two predictions within ``CLOSE_FRACTION`` of each other (plus ``CLOSE_MARGIN_MS``) are
the same within noise: then the endpoint with less load (latgate's in flight plus the
engine's other requests, per unit of weight) takes the request, and on equal load they
take turns. So identical replicas split traffic evenly whether requests come one at a
time or together, even when the engine reports no queue (vLLM's waiting count stays 0
until its own ``max_num_seqs`` is reached, so without a known capacity the queue term of
the prediction is 0 and load must count here).
"""

from __future__ import annotations

from latgate.routing.policies.rendezvous import rendezvous_score
from latgate.routing.policies.view import EndpointView, usable

CLOSE_FRACTION = 0.25
CLOSE_MARGIN_MS = 10.0


def close(a_ms: float, b_ms: float) -> bool:
    """True when two predicted latencies (TTFT, or e2e) are the same within noise.

    Example::

        close(100.0, 120.0)  # True: within 25% + 10 ms
        close(20.0, 80.0)    # False
    """
    return abs(a_ms - b_ms) <= CLOSE_FRACTION * min(a_ms, b_ms) + CLOSE_MARGIN_MS


def _candidates(views: list[EndpointView], *, trial_first: bool) -> list[int] | int:
    """The usable indexes (:func:`usable`), views on trial left out unless
    ``trial_first``, or the index of the view on trial that takes the request."""
    candidates = usable(views)
    if trial_first:
        for index in candidates:
            if views[index].trial and views[index].available:
                return index
        return candidates
    return [i for i in candidates if not views[i].trial] or candidates


def choose_power_of_two(
    views: list[EndpointView],
    *,
    draws: tuple[int, int],
    trial_first: bool = True,
    turn: int = 0,
    explore: bool = False,
    compare_all: bool = False,
    budget_ms: float | None = None,
    home: int | None = None,
    identity: int | None = None,
) -> int:
    """The index of the endpoint that takes the request.

    Args:
        views: the provider's endpoints.
        draws: two non-negative random integers choosing the pair when there are more
            than two candidates.
        trial_first: a view on trial (half-open) is chosen before any other, so a
            recovered endpoint is found out with the first request after its time out;
            when False (a request that cannot risk it), views on trial are passed over
            while another is available.
        turn: the provider's request counter: equal candidates take turns by it.
        explore: this request may be spent on an endpoint whose estimate is thin or
            stale (``view.explore``) and that is not known to be busy nor more loaded than
            the least loaded: the one with the fewest observations takes it (the caller
            bounds how often).
        compare_all: compare every candidate instead of two drawn (a request with a
            budget, whose tail matters more than the herd risk of one process).
        budget_ms: the request's TTFT budget, or None. With one, the compared endpoints
            whose ``p90_ttft_ms`` meets it are the candidates (all of them when none
            does), and they are ranked by ``predicted_e2e_ms`` instead of TTFT.
        home: the index of the session's endpoint (holding the longest prefix of the
            prompt, or where the client's session was served last), or None.
        identity: the session's number (its key, or its first message's hash) for
            rendezvous hashing between equals (explored ones too), or None.

    Returns:
        Otherwise, among the compared: of those :func:`close` to the lowest predicted
        TTFT (e2e with a budget), the least loaded; of equally loaded, ``home``, else
        with an ``identity`` the highest rendezvous score, else the first at or after
        ``turn``.

    Example::

        views = [EndpointView(predicted_ttft_ms=80.0), EndpointView(predicted_ttft_ms=20.0)]
        choose_power_of_two(views, draws=(0, 0))  # 1
    """
    candidates = _candidates(views, trial_first=trial_first)
    if isinstance(candidates, int):
        return candidates
    if explore:
        least = min(views[i].load for i in candidates)
        thin = [
            i
            for i in candidates
            if views[i].explore and views[i].available and not views[i].busy and views[i].load <= least
        ]
        if thin:
            count = len(views)
            if identity is not None:  # equals by rendezvous: a session explores one place
                return min(
                    thin,
                    key=lambda i: (
                        views[i].observations,
                        views[i].load,
                        -rendezvous_score(identity, views[i].salt),
                    ),
                )
            return min(thin, key=lambda i: (views[i].observations, views[i].load, (i - turn) % count))
    if len(candidates) > 2 and not compare_all:
        first = draws[0] % len(candidates)
        second = draws[1] % (len(candidates) - 1)
        if second >= first:
            second += 1
        candidates = sorted((candidates[first], candidates[second]))
    if budget_ms is not None:
        candidates = [i for i in candidates if views[i].p90_ttft_ms <= budget_ms] or candidates
    if len(candidates) == 1:
        return candidates[0]
    if budget_ms is None:
        predicted = [views[i].predicted_ttft_ms for i in candidates]
    else:
        predicted = [views[i].predicted_e2e_ms for i in candidates]
    fastest = min(predicted)
    near = [i for i, value in zip(candidates, predicted, strict=True) if close(value, fastest)]
    least = min(views[i].load for i in near)
    equals = [i for i in near if views[i].load == least]
    if len(equals) == 1:
        return equals[0]
    if home is not None and home in equals:
        return home
    if identity is not None:
        return max(equals, key=lambda i: rendezvous_score(identity, views[i].salt))
    count = len(views)
    return min(equals, key=lambda i: (i - turn) % count)


def choose_for_session(
    views: list[EndpointView],
    *,
    prompt_tokens: int,
    sessions: list[int],
    queued_tokens: list[float],
    speed: list[float],
    home: int | None,
    identity: int,
    trial_first: bool = True,
) -> int:
    """The endpoint for one turn of a conversation, on a provider whose engines cache
    prefixes and prefill one request after another: what a turn waits for is the
    uncached prompt tokens ahead of it and its own, at the endpoint's speed. The turn
    stays on ``home`` unless another endpoint has less than that work by more than
    ``CLOSE_FRACTION``; a conversation without a home (its first turn, or its endpoint
    out of service), or leaving it, is placed by session balance.

    Comparing work in tokens keeps the choice off the TTFT fit's split between its
    fixed part and its slope, which prompts of one uncached size cannot pin down (a
    session's turns all add about the same): a line that lost its slope would price a
    whole history's prefill elsewhere like one turn's.

    Args:
        prompt_tokens: the prompt's tokens.
        views: the provider's endpoints (every one compared); ``cached_tokens`` is
            what each is believed to hold of the prompt, ``busy`` counts.
        sessions: conversations placed on each endpoint now, this one not counted.
        queued_tokens: uncached prompt tokens sent to each and not yet prefilled.
        speed: each endpoint's time per token relative to a typical peer's (1: as
            fast, 2: twice as slow); up to ``1 + CLOSE_FRACTION`` counts as 1.
        home: the index of the conversation's endpoint (holding its history, or where
            its client's session was served last), or None.
        identity: the conversation's number, for rendezvous hashing between equals.
        trial_first: as :func:`choose_power_of_two`.

    Returns:
        ``home`` while its work (queued plus the prompt's uncached tokens, times its
        speed) is within ``CLOSE_FRACTION`` of the least and it is not busy. Otherwise,
        among the endpoints within that of the least (leaving home), or (a new
        conversation) among those not busy whose queued work is at most the least
        work: the fewest conversations per unit of speed (a new session goes where it
        adds least to the sessions sharing one prefill), then the least work, then the
        least loaded, then the highest rendezvous score.

    Example::

        views = [EndpointView(cached_tokens=8_000), EndpointView(cached_tokens=8_000)]
        choose_for_session(views, prompt_tokens=9_600, sessions=[3, 2], queued_tokens=[0, 0],
                           speed=[1.0, 1.0], home=None, identity=7)  # 1
    """
    candidates = _candidates(views, trial_first=trial_first)
    if isinstance(candidates, int):
        return candidates
    speeds = [1.0 if value <= 1.0 + CLOSE_FRACTION else value for value in speed]
    work = [speeds[i] * (queued_tokens[i] + max(0, prompt_tokens - views[i].cached_tokens)) for i in range(len(views))]
    least = min(work[i] for i in candidates)

    def near(i: int) -> bool:
        return work[i] <= (1.0 + CLOSE_FRACTION) * least

    if home is not None and home in candidates:
        if near(home) and not views[home].busy:
            return home
        pool = [i for i in candidates if i != home and near(i)]
    else:
        pool = [i for i in candidates if not views[i].busy and speeds[i] * queued_tokens[i] <= least]
    pool = pool or candidates

    def rank(i: int) -> tuple[float, bool, float, int]:
        return ((sessions[i] + 1) * speeds[i], not near(i), views[i].load, -rendezvous_score(identity, views[i].salt))

    return min(pool, key=rank)
