"""Container health = Triton's readiness (every model loaded) and, for one node of a deployment over
several servers, every peer server connected: exit 0 when /v2/health/ready answers 200 and the
metrics page has no ``tokenrouter_peer_connected`` sample at 0.

    python3 /opt/tokenrouter/docker/healthcheck.py [READY_URL [METRICS_URL]]

Standard library only: the NGC images have python3 but not always curl.
"""

from __future__ import annotations

import re
import sys
import urllib.error
import urllib.request

READY_URL = "http://localhost:8000/v2/health/ready"
METRICS_URL = "http://localhost:8002/metrics"
DISCONNECTED = re.compile(r"^tokenrouter_peer_connected\{[^}]*\} 0(\.0*)?$", re.M)


def ready(url: str = READY_URL, metrics_url: str = METRICS_URL, timeout: float = 4.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if response.status != 200:
                return False
        with urllib.request.urlopen(metrics_url, timeout=timeout) as response:
            return not DISCONNECTED.search(response.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError):  # not listening yet, 4xx/5xx (models loading), timeout
        return False


if __name__ == "__main__":
    sys.exit(0 if ready(*sys.argv[1:3]) else 1)
