"""Container health = every server ready: Triton's readiness (every model loaded), the
OpenAI-compatible server's /health (it reaches Triton and the fronts) and, on the metrics page, no
peer server of the deployment disconnected (``tokenrouter_peer_connected`` at 0: a node of a
deployment over several servers, docs/deploy.md). Exit 0 when every URL answers 200 (and a
``/metrics`` URL shows every peer connected).

    python3 /opt/tokenrouter/docker/healthcheck.py [URL ...]

Standard library only: the NGC images have python3 but not always curl.
"""

from __future__ import annotations

import re
import sys
import urllib.error
import urllib.request

READY_URLS = ("http://localhost:8000/v2/health/ready", "http://localhost:9000/health", "http://localhost:8002/metrics")
DISCONNECTED = re.compile(r"^tokenrouter_peer_connected\{[^}]*\} 0(\.0*)?$", re.M)


def ready(url: str, timeout: float = 4.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if response.status != 200:
                return False
            return not url.endswith("/metrics") or not DISCONNECTED.search(response.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError):  # not listening yet, 4xx/5xx (models loading), timeout
        return False


if __name__ == "__main__":
    sys.exit(0 if all(ready(url) for url in sys.argv[1:] or READY_URLS) else 1)
