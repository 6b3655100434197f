"""Routing: where a request goes, in three steps, each over plain data.

1. :class:`~latgate.routing.decision.Router` (rules only, no live numbers): the
   request's prompt tokens (:mod:`.tokens`), its budget and flags, and the candidate
   providers in order: a :class:`~latgate.routing.targets.RouteDecision`.
2. :class:`~latgate.routing.admission.Admission` may hold a latency-sensitive request
   for a free slot of a pool that refuses rather than queues (TileRT).
3. :class:`~latgate.routing.selection.Selector` makes it concrete with the endpoints'
   live numbers: a :class:`~latgate.routing.plan.RoutePlan` (provider order, first
   endpoint, hedge).

The forwarder (:mod:`latgate.forwarding.forward`) follows the plan through this interface
only: :meth:`Selector.plan`, :meth:`Selector.next_endpoint` for a further attempt,
:meth:`Selector.deadline_ms` for an attempt's first-token deadline,
:meth:`Selector.hedge_target` when a hedge is sent, and
:func:`~latgate.routing.policies.retry.after_failure` after a failed attempt. Every
choice is a pure function of :mod:`.policies` over snapshots.
"""
