"""Whether a provider takes ``stream_options`` (OpenAI's ``{"include_usage": true}`` on
a stream), learnt at run time from evidence, and forgotten again.

Some OpenAI-compatible upstreams refuse the field outright (a 400 or 422 naming it).
latgate asks for usage on every stream itself, so such a provider would refuse every
stream; it is then sent the stream again at once without the field, and usage is
latgate's own count. What counts as evidence (see :mod:`latgate.forwarding.attempt`): a
refusal of latgate's own well-formed ``{"include_usage": true}`` (injected, or the
client's identical one) that the same request *without* the field then gets past, so
the field itself was the problem. A refusal of anything else a client wrote in
``stream_options`` teaches nothing, nor does a refusal the stream without the field
gets as well.

One piece of evidence is not forever: the field is withheld for
:data:`FIRST_WITHHOLD_SECONDS`, then tried again; each refusal confirmed in a row
doubles the time, up to :data:`MAX_WITHHOLD_SECONDS`; an accepted stream with the field
clears the count. Pure state, with the time passed in (monotonic seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

#: how long the field is withheld after a first confirmed refusal
FIRST_WITHHOLD_SECONDS = 60.0
#: the longest it is withheld after refusals in a row
MAX_WITHHOLD_SECONDS = 3600.0
#: the ``stream_options`` latgate itself sends (and learns from when refused)
OWN_STREAM_OPTIONS = {"include_usage": True}


@dataclass(slots=True)
class StreamOptionsSupport:
    """One provider's learnt support for ``stream_options``.

    Attributes:
        withheld_until: monotonic time before which the field is not sent (0: sent).
        refusals: confirmed refusals in a row (0 once a stream with the field is taken).
    """

    withheld_until: float = 0.0
    refusals: int = 0

    def withheld(self, now: float) -> bool:
        """True when ``stream_options`` is not to be sent at ``now``."""
        return now < self.withheld_until

    def refused(self, now: float) -> float:
        """Record a confirmed refusal at ``now``; returns for how many seconds the field
        is now withheld (:data:`FIRST_WITHHOLD_SECONDS`, doubled per refusal in a row,
        at most :data:`MAX_WITHHOLD_SECONDS`)."""
        seconds = min(FIRST_WITHHOLD_SECONDS * 2.0 ** min(self.refusals, 32), MAX_WITHHOLD_SECONDS)
        self.refusals += 1
        self.withheld_until = now + seconds
        return seconds

    def accepted(self) -> None:
        """A stream sent with the field was taken: refusals in a row start again from 0."""
        self.refusals = 0
        self.withheld_until = 0.0
