"""Container health = both servers ready: Triton's readiness (every model loaded) and the
OpenAI-compatible server's /health (it reaches Triton and the fronts). Exit 0 when every URL
answers 200.

    python3 /opt/tokenrouter/docker/healthcheck.py [URL ...]

Standard library only: the NGC images have python3 but not always curl.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

READY_URLS = ("http://localhost:8000/v2/health/ready", "http://localhost:9000/health")


def ready(url: str, timeout: float = 4.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):  # not listening yet, 4xx/5xx (models loading), timeout
        return False


if __name__ == "__main__":
    sys.exit(0 if all(ready(url) for url in sys.argv[1:] or READY_URLS) else 1)
