"""Container health = Triton's readiness (every model loaded): exit 0 when /v2/health/ready answers 200.

    python3 /opt/tokenrouter/docker/healthcheck.py [URL]

Standard library only: the NGC images have python3 but not always curl.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

READY_URL = "http://localhost:8000/v2/health/ready"


def ready(url: str = READY_URL, timeout: float = 4.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):  # not listening yet, 4xx/5xx (models loading), timeout
        return False


if __name__ == "__main__":
    sys.exit(0 if ready(*sys.argv[1:2]) else 1)
