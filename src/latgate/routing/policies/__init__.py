"""Routing policies: pure choices over a snapshot of endpoints' live numbers.

Each module is one decision, taking plain data (:class:`EndpointView` snapshots,
numbers) and returning an index or a number: no I/O, no clock, no randomness of its
own (random draws are passed in), so each is unit-tested with literals. The
:class:`~latgate.routing.selection.Selector` takes the snapshots from live numbers and
calls these; the forwarder calls :mod:`.retry` after each failed attempt.

- :mod:`.round_robin`, :mod:`.least_outstanding`: the baseline endpoint choices.
- :mod:`.predicted_ttft`: power of two choices by predicted time to first token.
- :mod:`.rendezvous`: a stable endpoint for a session between equal endpoints.
- :mod:`.overflow`: keep the preferred provider or move to the one most likely to meet
  the request's time-to-first-token budget.
- :mod:`.hedging`: when to send a second copy of a request.
- :mod:`.deadline`: when to give up on an attempt that has sent no first token.
- :mod:`.outlier`: whether an endpoint is far slower than its peers.
- :mod:`.retry`: after a failed attempt, retry the provider (after how long) or move on.
"""

from latgate.routing.policies.view import EndpointView

__all__ = ["EndpointView"]
