"""Tier ``make test-prometheus`` (in .ci/run): collected only with LATGATE_TIER=prometheus,
so ``make test`` stays fast and needs no Prometheus."""

import os

collect_ignore_glob = [] if os.environ.get("LATGATE_TIER") == "prometheus" else ["*.py"]
