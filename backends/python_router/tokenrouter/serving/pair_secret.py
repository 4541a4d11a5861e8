"""The secret that the servers of one deployment share, so that a subserver takes peer messages
from another server only when they come from that deployment (placement.py).

The per-start secret (peer_auth.py) stays inside one server; this one is configured on every node
of a deployment over several servers, the same value on each, and never on a command line:

- ``TOKENROUTER_PAIR_SECRET_FILE``: a file holding it (a Docker or Kubernetes secret mounts one);
- or ``TOKENROUTER_PAIR_SECRET``: the value itself. The launcher (triton_server.py, start) moves it
  into a private file before it starts tritonserver, so that no stub and nothing a stub starts has
  it in its environment.

A link call between servers (peer_sessions.py) carries it as a request parameter; without it the peer refuses. It
travels in every call in clear text: between hosts, put the servers' gRPC ports on a trusted network
or an encrypted tunnel (docs/deploy.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from .peer_auth import write_private_file

PAIR_SECRET_FILE_ENV = "TOKENROUTER_PAIR_SECRET_FILE"
PAIR_SECRET_ENV = "TOKENROUTER_PAIR_SECRET"
MIN_LENGTH = 16


class PairSecretError(ValueError):
    """No usable pair secret; the message says how to give one."""


def pair_secret() -> str:
    """The deployment's secret, from the file or the environment (see the module docstring)."""
    path = os.environ.get(PAIR_SECRET_FILE_ENV)
    if path:
        try:
            secret = Path(path).read_text().strip()
        except OSError as err:
            raise PairSecretError(f"{PAIR_SECRET_FILE_ENV}={path}: cannot read it ({err.strerror})") from None
        source = f"the file {path} ({PAIR_SECRET_FILE_ENV})"
    else:
        secret, source = os.environ.get(PAIR_SECRET_ENV, "").strip(), PAIR_SECRET_ENV
    if not secret:
        raise PairSecretError(f"models on several servers need a secret shared by every server: put it in a "
                              f"file and set {PAIR_SECRET_FILE_ENV} to its path (or set {PAIR_SECRET_ENV}) on "
                              f"each node, e.g. `openssl rand -base64 32 > pair-secret` (docs/deploy.md)")
    if len(secret) < MIN_LENGTH:
        raise PairSecretError(f"the pair secret in {source} has {len(secret)} characters; use at least "
                              f"{MIN_LENGTH} (e.g. `openssl rand -base64 32`)")
    return secret


def move_secret_to_file(env: dict[str, str], path: Path) -> bool:
    """For the launcher: a secret given as ``TOKENROUTER_PAIR_SECRET`` in ``env`` (tritonserver's
    environment, inherited by every stub) goes into ``path`` (0600, this user's) and ``env`` names the
    file instead. Whether the file was written (the caller removes it when the server stops)."""
    secret = env.pop(PAIR_SECRET_ENV, None)
    if not secret or env.get(PAIR_SECRET_FILE_ENV):
        return False
    write_private_file(path, secret)
    env[PAIR_SECRET_FILE_ENV] = str(path)
    return True

