"""The live routing page at ``GET /ui``: plain HTML, CSS and JavaScript in ``static/``
(no build step, nothing from outside), polling ``GET /ui/state`` once a second.

:class:`~latgate.app.ui.activity.Activity` keeps what the page shows besides the pool's
live numbers: the last few hundred finished requests (a ring the request path appends
to; everything else is computed only when someone polls) and events (hedges,
fallbacks, retries, ejections as counters move; overflows, admission waits and
predicted misses from route reasons). Routes are in :mod:`latgate.app.ui.routes`.
"""

from latgate.app.ui.activity import RECENT_REQUESTS, Activity
from latgate.app.ui.routes import authorize, endpoints, route_entries

__all__ = ["RECENT_REQUESTS", "Activity", "authorize", "endpoints", "route_entries"]
