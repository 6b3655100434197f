"""Container health check for latgate and its simulators (slim images have no curl).

Usage: python healthcheck.py [URL]

GETs URL (default: $LATGATE_HEALTHCHECK_URL, else http://127.0.0.1:8000/healthz) and
exits 0 on HTTP 200, 1 on anything else (refused, timeout, other status), printing one
line either way. Standard library only, so it runs in the image as it is.
"""

import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/healthz"
TIMEOUT_SECONDS = 3.0


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else os.environ.get("LATGATE_HEALTHCHECK_URL", DEFAULT_URL)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (OSError, ValueError) as error:
        print(f"unhealthy: {url}: {getattr(error, 'reason', error)}")
        return 1
    if status != 200:
        print(f"unhealthy: {url}: HTTP {status}")
        return 1
    print(f"healthy: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
