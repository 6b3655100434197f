"""How a serving process sets up Python's cyclic garbage collector.

A proxied request parses its body into a tree of dicts and lists (a 100 KB agent body:
about a thousand containers), alive while the request is, then freed by reference
counting: JSON trees hold no cycles. Under the collector's defaults (a young-generation
collection every 700 container allocations) each such body triggers collections that
traverse every live body, promote them, and every so often a full collection that
traverses the whole heap, config, routes and imported modules included. :func:`settle_heap`
moves what exists once the app is built into the permanent generation (``gc.freeze``:
never traversed again) and collects the young generation less often; cycles (an
exception and its traceback, a cancelled task) are still collected, later.
"""

from __future__ import annotations

import gc

#: Container allocations (net of frees) between young-generation collections; the
#: default is 700, less than one agent body.
YOUNG_COLLECTION_ALLOCATIONS = 50_000


def settle_heap() -> None:
    """Collect once, freeze what survives (the app as built), and raise the young
    generation's threshold to :data:`YOUNG_COLLECTION_ALLOCATIONS`. Call once per
    serving process, after the app is built and before the first request."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, middle, old)
