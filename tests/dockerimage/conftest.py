"""Tier ``make test-docker`` (in .ci/run): collected only with LATGATE_TIER=docker, so
``make test`` needs no Docker engine."""

import os

collect_ignore_glob = [] if os.environ.get("LATGATE_TIER") == "docker" else ["*.py"]
