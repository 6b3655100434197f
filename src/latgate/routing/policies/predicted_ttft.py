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
        draws: two non-negative random integers choosing the pair (of more than two).
        trial_first: a view on trial (half-open) is chosen before any other (a
            recovered endpoint is found out at once); False (a request that cannot risk
            it): views on trial are passed over while another is available.
        turn: the provider's request counter: equal candidates take turns by it.
        explore: this request may be spent on an endpoint whose estimate is thin or
            stale (``view.explore``), not known to be busy nor more loaded than the least
            loaded: the one with the fewest observations (the caller bounds how often).
        compare_all: compare every candidate instead of two drawn (a request with a
            budget: its tail matters more than the herd risk).
        budget_ms: the request's TTFT budget, or None. With one, the compared endpoints
            whose ``p90_ttft_ms`` meets it (all, when none does) ranked by ``predicted_e2e_ms``.
        home: the index of the session's endpoint (holding the longest prefix of the
            prompt, or where the client's session was served last), or None.
        identity: the session's number, for rendezvous hashing between equals, or None.

    Returns:
        Otherwise, among the compared: of those :func:`close` to the lowest predicted
        TTFT (e2e with a budget), the least loaded, then ``home``, then the highest
        rendezvous score of ``identity``, then the first at or after ``turn``.

    Example::

        views = [EndpointView(predicted_ttft_ms=80.0), EndpointView(predicted_ttft_ms=20.0)]
        choose_power_of_two(views, draws=(0, 0))  # 1
    """
    candidates = _candidates(views, trial_first=trial_first)
    if isinstance(candidates, int):
        return candidates
    if explore:
        thin = _explored(views, candidates, turn=turn, identity=identity)
        if thin is not None:
            return thin
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
    return _closest(views, candidates, budget_ms=budget_ms, turn=turn, home=home, identity=identity)


def _explored(views: list[EndpointView], candidates: list[int], *, turn: int, identity: int | None) -> int | None:
    """The explored endpoint that takes the request (:func:`choose_power_of_two`'s
    ``explore``), or None when no candidate is thin, available, not busy and least loaded."""
    least = min(views[i].load for i in candidates)
    thin = [
        i
        for i in candidates
        if views[i].explore and views[i].available and not views[i].busy and views[i].load <= least
    ]
    if not thin:
        return None
    if identity is not None:  # equals by rendezvous: a session explores one place
        return min(
            thin,
            key=lambda i: (views[i].observations, views[i].load, -rendezvous_score(identity, views[i].salt)),
        )
    count = len(views)
    return min(thin, key=lambda i: (views[i].observations, views[i].load, (i - turn) % count))


def _closest(
    views: list[EndpointView],
    candidates: list[int],
    *,
    budget_ms: float | None,
    turn: int,
    home: int | None,
    identity: int | None,
) -> int:
    """Of ``candidates``, those :func:`close` to the lowest predicted TTFT (e2e with a
    budget), the least loaded; of equally loaded, ``home``, else by rendezvous on
    ``identity``, else the first at or after ``turn``."""
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
    uncached prompt tokens ahead of it and its own, at the endpoint's speed (its
    *work*), in tokens: off the TTFT fit's split between its fixed part and its slope,
    which prompts of one uncached size cannot pin down.

    Args:
        prompt_tokens: the prompt's tokens.
        views: the provider's endpoints (every one compared); ``cached_tokens`` is
            what each is believed to hold of the prompt, ``busy`` counts.
        sessions: conversations placed on each endpoint now, this one not counted;
            ``queued_tokens``: uncached prompt tokens sent to each, not yet prefilled.
        speed: each endpoint's time per token relative to a typical peer's (1: as
            fast, 2: twice as slow); up to ``1 + CLOSE_FRACTION`` counts as 1.
        home: the conversation's endpoint (holding its history, or where its client's
            session was served last), or None. ``identity``: its number (rendezvous).
        trial_first: a view on trial (half-open) may take the turn, compared by its
            work, never first: a turn is a trial only where it has the slack (others
            find a recovered endpoint, or its slowness fades); False: passed over.

    Returns:
        ``home`` while not busy and its work is within ``CLOSE_FRACTION`` of the least
        (none for a home measured slow) and at most the whole prompt (or the least); else (:func:`_leave_home`) another close one, or home. A new
        conversation: of those not busy, with queued work at most the least work and
        work at most the whole prompt (no slow endpoint with few sessions keeps it past
        an uncached prefill elsewhere), the best by :func:`_session_rank`.

    Example::

        views = [EndpointView(cached_tokens=8_000), EndpointView(cached_tokens=8_000)]
        choose_for_session(views, prompt_tokens=9_600, sessions=[3, 2], queued_tokens=[0, 0],
                           speed=[1.0, 1.0], home=None, identity=7)  # 1: fewer sessions
    """
    candidates = usable(views)
    if not trial_first:
        candidates = [i for i in candidates if not views[i].trial] or candidates
    speeds = [1.0 if value <= 1.0 + CLOSE_FRACTION else value for value in speed]
    work = [speeds[i] * (queued_tokens[i] + max(0, prompt_tokens - views[i].cached_tokens)) for i in range(len(views))]
    least = min(work[i] for i in candidates)
    near = [i for i in candidates if work[i] <= (1.0 + CLOSE_FRACTION) * least]
    if home is not None and home in candidates:
        slack = (1.0 + CLOSE_FRACTION * (speeds[home] == 1.0)) * least  # none for a home measured slow
        if work[home] <= max(least, min(slack, prompt_tokens)) and not views[home].busy:
            return home
        pool = _leave_home(views, home, near, sessions, speeds, work, prompt_tokens)
    else:
        bound = max(least, prompt_tokens)
        pool = [i for i in candidates if not views[i].busy and speeds[i] * queued_tokens[i] <= least and work[i] <= bound]
    return min(pool or candidates, key=lambda i: _session_rank(views, i, sessions, speeds, near, identity))


def _leave_home(
    views: list[EndpointView],
    home: int,
    near: list[int],
    sessions: list[int],
    speeds: list[float],
    work: list[float],
    prompt_tokens: int,
) -> list[int]:
    """Where a turn whose home is not close (or busy) may go: the close endpoints less
    crowded with it than home is (conversations per unit of speed: a move never makes
    a new most crowded endpoint, so a slower replica's sessions spread over the others
    without piling up on one of them); with none, ``home`` itself while not busy and its work is at most the
    whole prompt prefilled uncached at a typical speed (what the turn would wait
    anywhere without a cache: moving would crowd another endpoint to save less), else
    every close one."""
    crowd = (sessions[home] + 1) * speeds[home]
    roomy = [i for i in near if i != home and (sessions[i] + 1) * speeds[i] < crowd]
    if roomy:
        return roomy
    if not views[home].busy and work[home] <= prompt_tokens:
        return [home]
    return [i for i in near if i != home]


def _session_rank(
    views: list[EndpointView], i: int, sessions: list[int], speeds: list[float], near: list[int], identity: int
) -> tuple[float, bool, float, int]:
    """Placing a conversation: the fewest conversations per unit of speed (a new one goes
    where it adds least to those sharing one prefill), then the work within
    ``CLOSE_FRACTION`` of the least, then the least loaded, then the highest rendezvous
    score."""
    return ((sessions[i] + 1) * speeds[i], i not in near, views[i].load, -rendezvous_score(identity, views[i].salt))
