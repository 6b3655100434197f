"""Priority classes: which request goes first when a pool is full.

Three classes, lowest first: ``batch`` (may wait long, may be shed or preempted),
``default``, ``interactive`` (a person is waiting). A request's class is, in order:

1. what it claims with ``X-Latgate-Priority: interactive | default | batch`` (or the
   class's number: ``0`` batch, ``1`` default, ``2`` interactive), else its route
   policy's ``priority``, else ``default``;
2. at least ``default`` when it has a latency budget or is latency-sensitive;
3. at most its key's ``priority`` (``[[auth.keys]] priority``, the key's ceiling), so a
   client cannot promote itself: the ceiling is applied last, over the budget rule too.

The class orders the gateway queue (:mod:`latgate.routing.queue`); it changes nothing
for a request that does not wait.
"""

from __future__ import annotations

from latgate.foundation.errors import InvalidRequest
from latgate.routing.headers import shown_value

BATCH = 0
DEFAULT = 1
INTERACTIVE = 2
CLASS_NAMES = ("batch", "default", "interactive")
"""Class names by number (``CLASS_NAMES[BATCH] == "batch"``)."""
_BY_NAME = {name: number for number, name in enumerate(CLASS_NAMES)}
_BY_NAME.update({str(number): number for number in range(len(CLASS_NAMES))})


def class_number(name: str) -> int:
    """The number of a class name or number text (``"batch"`` -> 0); ``KeyError`` for
    anything else (the config loader and :func:`priority_header` report it)."""
    return _BY_NAME[name.strip().lower()]


def priority_header(value: str | None) -> int | None:
    """``X-Latgate-Priority``: a class name or number, None when absent or empty.

    Raises:
        InvalidRequest: any other value (400, naming the header and the values it takes).
    """
    if value is None or not value.strip():
        return None
    try:
        return class_number(value)
    except KeyError:
        raise InvalidRequest(
            f"X-Latgate-Priority must be interactive, default or batch (or 2, 1, 0), not {shown_value(value)}",
            param="X-Latgate-Priority", code="invalid_header_value",
        ) from None


def effective_priority(
    *, claimed: int | None, policy: str | None, ceiling: str | None, has_budget: bool, latency_sensitive: bool
) -> int:
    """The request's class number (see the module docstring for the order of rules).

    Args:
        claimed: the header's class (:func:`priority_header`), or None.
        policy: the route policy's ``priority`` name, or None.
        ceiling: the key's ``priority`` name, or None (no key, or no ceiling).
        has_budget: the request has a latency budget (header or policy).
        latency_sensitive: the request is latency-sensitive (header or model).

    Example::

        effective_priority(claimed=INTERACTIVE, policy=None, ceiling="default",
                           has_budget=False, latency_sensitive=False)  # DEFAULT
    """
    number = claimed if claimed is not None else (class_number(policy) if policy else DEFAULT)
    if has_budget or latency_sensitive:
        number = max(number, DEFAULT)
    if ceiling:
        number = min(number, class_number(ceiling))
    return number
