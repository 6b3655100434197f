"""After a failed attempt: try the same provider again (after how long), or move on.

The forwarder asks this after every attempt that failed before anything reached the
client, and retries only as it says; where the next attempt goes (another endpoint of
the provider, or the next candidate) is the
:class:`~latgate.routing.selection.Selector`'s choice, except after a refusal of the
stream's ``stream_options``: the same endpoint again at once, without them.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKOFF_BASE_SECONDS = 0.05
"""The pause before the first retry when the upstream named none; doubled each retry."""
BACKOFF_CAP_SECONDS = 1.0
MAX_RETRY_AFTER_SECONDS = 5.0
"""An upstream's ``Retry-After`` longer than this is not waited for: the fallbacks are
tried instead."""


@dataclass(frozen=True, slots=True)
class AfterFailure:
    """What to do after a failed attempt.

    Attributes:
        retry: try the same provider again (``False``: on to the next candidate).
        delay_seconds: the pause before that retry (0 when moving on).
        next_provider: another provider may help (``False``: the client's own
            mistake, which every provider would refuse alike: stop).
        without_stream_options: the retry is the same request to the same endpoint,
            sent at once without ``stream_options`` (its refusal was of the field, not
            of the request); it is not one of ``max_retries``.
    """

    retry: bool
    delay_seconds: float = 0.0
    next_provider: bool = True
    without_stream_options: bool = False


def after_failure(
    *,
    retryable: bool,
    busy: bool,
    client_mistake: bool,
    retry_after_seconds: float | None,
    retries_done: int,
    max_retries: int,
    stream_options_refused: bool = False,
) -> AfterFailure:
    """The step after a failed attempt.

    Args:
        retryable: the failure is one another attempt may not share (a connection
            failure, a timeout, a 429/5xx; see :mod:`latgate.forwarding.failures`).
        busy: the provider said it is full (TileRT's busy 429): not failing, so no
            retry and no pause, the next candidate at once.
        client_mistake: the failure is the request's own (a 4xx other than 401/403,
            408 and 429): no other provider would answer it either.
        retry_after_seconds: the upstream's ``Retry-After``, or None.
        retries_done: retries already made on this provider (0 after its first attempt).
        max_retries: ``defaults.max_retries``.
        stream_options_refused: the provider refused the stream's ``stream_options``
            (a 400 or 422 naming them, as OpenAI-compatible servers that do not know
            the field answer; :func:`latgate.forwarding.wire.refuses_stream_options`).

    Returns:
        After a refusal of ``stream_options``: a retry at once on the same endpoint
        without them (:attr:`AfterFailure.without_stream_options`), whatever
        ``max_retries`` says (the request itself was not tried; sent without the field
        it cannot be refused so again). Else a retry of a retryable failure while
        retries are left: after the upstream's
        ``Retry-After`` when it names one of at most :data:`MAX_RETRY_AFTER_SECONDS`,
        else after an exponential back-off (:data:`BACKOFF_BASE_SECONDS` doubled per
        retry, at most :data:`BACKOFF_CAP_SECONDS`). Otherwise the next candidate, or
        none for the client's own mistake.

    Example::

        after_failure(retryable=True, busy=False, client_mistake=False,
                      retry_after_seconds=None, retries_done=1, max_retries=2)
        # AfterFailure(retry=True, delay_seconds=0.1)
    """
    if stream_options_refused:
        return AfterFailure(retry=True, without_stream_options=True)
    if retryable and not busy and retries_done < max_retries:
        if retry_after_seconds is None:
            return AfterFailure(retry=True, delay_seconds=min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2**retries_done))
        if retry_after_seconds <= MAX_RETRY_AFTER_SECONDS:
            return AfterFailure(retry=True, delay_seconds=retry_after_seconds)
    return AfterFailure(retry=False, next_provider=not client_mistake)
