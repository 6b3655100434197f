"""Endpoint health: a circuit breaker per endpoint, fed by requests, probes and latency.

::

    closed --(failure_threshold failed requests, or probe_failure_threshold failed
    |         probes in a row, or ejected as too slow)--> open
    open   --(open_sec elapsed, or the engine answers again: a good probe or load
    |         read, when it opened for errors or probes)--> half_open: one trial at a time
    half_open --(trial succeeds)--> closed
    half_open --(trial fails)--> open again, for twice as long (up to max_open_sec)

A success restores an endpoint opened for errors at once (whatever its circuit: a request
that was in flight when it opened proves it answers); a successful probe restores one
in half-open that was opened for errors or failed probes. An endpoint ejected for
latency comes back only through a trial request fast enough (the caller judges it:
:meth:`CircuitBreaker.judge_latency`). Client-caused errors (400, 404, 413, 422...)
never reach this module: the caller does not report them.

State lives behind :class:`CircuitStore` (``get``/``put`` of one endpoint's
:class:`CircuitRecord`), so replicas can share it; :class:`MemoryCircuitStore` keeps
it in this process. Time comes from an injected clock (seconds, monotonic).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from latgate.foundation.config.schema import HealthConfig

Circuit = Literal["closed", "open", "half_open"]
OpenReason = Literal["errors", "probes", "latency", "shared"]
_ALIVE_ENDS = ("errors", "probes", "shared")
"""Open reasons that an engine answering again ends (not ``latency``)."""
CLOSED: Circuit = "closed"
OPEN: Circuit = "open"
HALF_OPEN: Circuit = "half_open"


@dataclass(slots=True)
class CircuitRecord:
    """One endpoint's circuit.

    Attributes:
        circuit: ``closed``, ``open`` or ``half_open``.
        reason: why it opened (``errors``, ``probes``, ``latency``, ``shared``: another
            replica ejected it), ``None`` when closed.
        consecutive_failures: failed requests since the last success.
        consecutive_probe_failures: failed probes since the last good one.
        opened_at: clock seconds when it last opened.
        open_seconds: how long it stays open before half-open.
        openings: times opened since it was last closed (the back-off exponent).
    """

    circuit: Circuit = CLOSED
    reason: OpenReason | None = None
    consecutive_failures: int = 0
    consecutive_probe_failures: int = 0
    opened_at: float = 0.0
    open_seconds: float = 0.0
    openings: int = 0


class CircuitStore(Protocol):
    """Where circuits are kept, by endpoint key (``PROVIDER:ENDPOINT_ID``).

    Calls are synchronous (they run on the request path): a shared backend keeps a
    local copy and reconciles it in the background.
    """

    def get(self, key: str) -> CircuitRecord:
        """The endpoint's record (a closed one when none was stored)."""
        ...

    def put(self, key: str, record: CircuitRecord) -> None:
        """Store the endpoint's record after a change."""
        ...


class MemoryCircuitStore:
    """Circuits of this process only."""

    def __init__(self) -> None:
        self._records: dict[str, CircuitRecord] = {}

    def get(self, key: str) -> CircuitRecord:
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = CircuitRecord()
        return record

    def put(self, key: str, record: CircuitRecord) -> None:
        self._records[key] = record


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of an endpoint's circuit, for metrics and logs."""

    key: str
    before: Circuit
    after: Circuit
    reason: OpenReason | None


class CircuitBreaker:
    """The circuit rules of the module docstring over a :class:`CircuitStore`.

    Args:
        settings: thresholds and open times (``[health]``).
        store: where records live.
        clock: seconds, monotonic.

    Every ``on_*`` method returns the :class:`Transition` it caused, or ``None``.
    """

    def __init__(self, *, settings: HealthConfig, store: CircuitStore, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock

    def circuit(self, key: str) -> Circuit:
        """The endpoint's circuit now (an open circuit whose time is up is half-open)."""
        record = self.store.get(key)
        circuit = record.circuit
        if circuit == OPEN and self._refresh(record) != OPEN:
            self.store.put(key, record)
            return record.circuit
        return circuit

    def _refresh(self, record: CircuitRecord) -> Circuit:
        if record.circuit == OPEN and self.clock() >= record.opened_at + record.open_seconds:
            record.circuit = HALF_OPEN
        return record.circuit

    def on_success(self, key: str) -> Transition | None:
        """A request answered (first content of a stream, or a whole body)."""
        record = self.store.get(key)
        record.consecutive_failures = 0
        if record.circuit != CLOSED and record.reason != "latency":
            return self._close(key, record)
        self.store.put(key, record)
        return None

    def on_failure(self, key: str) -> Transition | None:
        """A request failed for the endpoint's own reasons (connect, timeout, 5xx...)."""
        record = self.store.get(key)
        record.consecutive_failures += 1
        circuit = self._refresh(record)
        if circuit == HALF_OPEN:
            return self._open(key, record, record.reason or "errors")
        if circuit == CLOSED and record.consecutive_failures >= self.settings.failure_threshold:
            return self._open(key, record, "errors")
        self.store.put(key, record)
        return None

    def on_probe(self, key: str, *, ok: bool) -> Transition | None:
        """An active probe's result."""
        record = self.store.get(key)
        circuit = self._refresh(record)
        if ok:
            record.consecutive_probe_failures = 0
            if circuit == HALF_OPEN and record.reason in _ALIVE_ENDS:
                return self._close(key, record)
            if circuit == OPEN and record.reason in _ALIVE_ENDS:
                return self._half_open(key, record)
            self.store.put(key, record)
            return None
        record.consecutive_probe_failures += 1
        if circuit == HALF_OPEN:
            return self._open(key, record, record.reason or "probes")
        if circuit == CLOSED and record.consecutive_probe_failures >= self.settings.probe_failure_threshold:
            return self._open(key, record, "probes")
        self.store.put(key, record)
        return None

    def on_alive(self, key: str) -> Transition | None:
        """The engine answered something other than a request (its load gauges): an
        endpoint open for errors or probes gets its trial now rather than after its
        time out; one ejected for latency waits (answering says nothing of speed)."""
        record = self.store.get(key)
        if self._refresh(record) == OPEN and record.reason in _ALIVE_ENDS:
            return self._half_open(key, record)
        return None

    def _half_open(self, key: str, record: CircuitRecord) -> Transition:
        record.circuit = HALF_OPEN
        self.store.put(key, record)
        return Transition(key=key, before=OPEN, after=HALF_OPEN, reason=record.reason)

    def eject(self, key: str, *, reason: OpenReason) -> Transition | None:
        """Open the circuit now (too slow, or ejected by another replica)."""
        record = self.store.get(key)
        if record.circuit == OPEN:
            return None
        return self._open(key, record, reason)

    def judge_latency(self, key: str, *, too_slow: bool) -> Transition | None:
        """The verdict on a first token: ejects a closed endpoint that is ``too_slow``;
        ends the trial of one half-open after a latency ejection (closed when fast
        enough, open for longer when not)."""
        record = self.store.get(key)
        circuit = self._refresh(record)
        if circuit == CLOSED:
            return self._open(key, record, "latency") if too_slow else None
        if circuit == HALF_OPEN and record.reason == "latency":
            return self._open(key, record, "latency") if too_slow else self._close(key, record)
        self.store.put(key, record)
        return None

    def restore(self, key: str) -> Transition | None:
        """Close the circuit now (another replica saw the endpoint recover)."""
        record = self.store.get(key)
        if record.circuit == CLOSED:
            return None
        return self._close(key, record)

    def _open(self, key: str, record: CircuitRecord, reason: OpenReason) -> Transition:
        before = record.circuit
        settings = self.settings
        record.circuit = OPEN
        record.reason = reason
        record.opened_at = self.clock()
        record.openings += 1
        record.open_seconds = min(settings.max_open_sec, settings.open_sec * 2 ** (record.openings - 1))
        self.store.put(key, record)
        return Transition(key=key, before=before, after=OPEN, reason=reason)

    def _close(self, key: str, record: CircuitRecord) -> Transition:
        before = record.circuit
        reason = record.reason
        record.circuit = CLOSED
        record.reason = None
        record.consecutive_failures = 0
        record.consecutive_probe_failures = 0
        record.openings = 0
        record.open_seconds = 0.0
        self.store.put(key, record)
        return Transition(key=key, before=before, after=CLOSED, reason=reason)
