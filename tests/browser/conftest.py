"""Tier ``make test-browser`` (in .ci/run): collected only with LATGATE_TIER=browser, so
``make test`` needs no browser."""

import os

collect_ignore_glob = [] if os.environ.get("LATGATE_TIER") == "browser" else ["*.py"]
