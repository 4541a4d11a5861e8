"""A stand-in tritonserver binary (a Python script to format and write out): it plays Triton's part as the
launcher sees it from outside: it dies by a signal for its first ``aborts`` runs, exits with ``exit_code``,
hangs idle with a child (``hang``), or, after ``busy_s`` seconds of burning CPU (a loading start), answers
/v2/health/ready on its HTTP port and starts a child (as a stub is) that stays up. What the tests check
is the launcher, not Triton."""

import sys
from pathlib import Path

STAND_IN = '''#!{python}
import http.server, os, signal, subprocess, sys, time
from pathlib import Path

runs = Path({runs!r})
runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
if len(runs.read_text()) <= {aborts}:
    os.kill(os.getpid(), signal.{signal})  # as the bundled 2.51 does on its lock_exception
if {exit_code}:
    sys.exit({exit_code})
if {hang}:  # never ready, with a child in its process group (as a stub is)
    Path({runs!r} + ".child").write_text(str(subprocess.Popen(["sleep", "600"]).pid))
    time.sleep(600)
busy_until = time.monotonic() + {busy_s}
while time.monotonic() < busy_until:
    pass
subprocess.Popen(["sleep", "600"])  # a stub: in its process group, with its environment
port = int(next(a for a in sys.argv if a.startswith("--http-port=")).split("=")[1])


class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
'''


def write_stand_in(binary: Path, runs: Path, *, aborts: int = 0, exit_code: int = 0, signal: str = "SIGABRT",
                   hang: bool = False, busy_s: float = 0.0) -> Path:
    """The stand-in written to ``binary`` (executable); each run appends a character to ``runs``."""
    binary.write_text(STAND_IN.format(python=sys.executable, runs=str(runs), aborts=aborts, exit_code=exit_code,
                                      signal=signal, hang=hang, busy_s=busy_s))
    binary.chmod(0o755)
    return binary
