"""Peer messages are for the subservers of one server only: a per-server-start secret proves it.

Triton exposes every model on its public ports, ``peer_message`` included, and has no per-model
access control. So a subserver takes a peer message only when the BLS request carries this
server start's secret as a request parameter; anything else (any client over HTTP or gRPC) is
refused before the message is even parsed.

Where the secret comes from:
- ``TOKENROUTER_PEER_SECRET`` in the environment: the launcher sets a fresh one per start, and
  every stub inherits tritonserver's environment;
- otherwise (tritonserver started by hand or by an image's entrypoint) the first stub creates it in
  a private folder (0700, file 0600) under a name that holds tritonserver's pid and start time, and
  the others read it: one secret per server start, never shared across starts.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

SECRET_ENV = "TOKENROUTER_PEER_SECRET"
SECRET_PARAMETER = "tokenrouter_peer_secret"
CONTROL_PARAMETER = "tokenrouter_control"
REASON_PARAMETER = "tokenrouter_reason"
# A front names each request it sends the entry by a key of its own choosing (new_request_key),
# passed with the secret; a "cancel" control call names the keys to end.
REQUEST_KEY_PARAMETER = "tokenrouter_request_key"
CANCEL_KEYS_PARAMETER = "tokenrouter_cancel_keys"


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def new_request_key() -> str:
    """A name for one request, unguessable, so that a forged cancel could not hit it even if the
    secret check were gone."""
    return secrets.token_urlsafe(16)


def server_secret(folder: Path | None = None) -> str:
    """This server start's secret (see the module docstring)."""
    from_env = os.environ.get(SECRET_ENV)
    if from_env:
        return from_env
    folder = folder or Path(tempfile.gettempdir()) / f"tokenrouter-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
        raise PermissionError(f"{folder} must belong to this user and be private (mode 0700)")
    _remove_secrets_of_dead_servers(folder)
    path = folder / f"peer-secret-{_server_identity()}"
    staging = folder / f".{path.name}.{os.getpid()}"
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(new_secret())
    try:
        os.link(staging, path)  # atomic: the first stub's secret wins, the others read it
    except FileExistsError:
        pass
    finally:
        staging.unlink()
    return path.read_text()


def _server_identity() -> str:
    """tritonserver (this stub's parent): pid and start time, so a reused pid gets a new secret."""
    parent = os.getppid()
    try:
        started = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "0"
    return f"{parent}-{started}"


def _remove_secrets_of_dead_servers(folder: Path) -> None:
    for stale in folder.glob("peer-secret-*"):
        pid = stale.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.unlink(missing_ok=True)


def peer_parameters(secret: str) -> dict[str, str]:
    """The BLS request parameters that authenticate a peer message."""
    return {SECRET_PARAMETER: secret}


def control_parameters(secret: str, command: str, reason: str) -> dict[str, str]:
    """Parameters of a control call from the launcher (which knows the secret it handed out).
    ``shutdown``: end every request in flight with an error that says ``reason``."""
    return {**peer_parameters(secret), CONTROL_PARAMETER: command, REASON_PARAMETER: reason}


def front_request_parameters(secret: str, key: str) -> dict[str, str]:
    """Parameters of a front's request to the entry subserver: the secret and the request's key."""
    return {**peer_parameters(secret), REQUEST_KEY_PARAMETER: key}


def cancel_parameters(secret: str, keys: list[str]) -> dict[str, str]:
    """Parameters of a front's control call that cancels the requests it named ``keys``."""
    return {**peer_parameters(secret), CONTROL_PARAMETER: "cancel", CANCEL_KEYS_PARAMETER: " ".join(keys)}


def request_parameters(request: Any) -> dict[str, Any] | None:
    """A Triton request's parameters; None when they cannot be read (the caller refuses: never
    fail open)."""
    try:
        parameters = json.loads(request.parameters() or "{}")
    except Exception:  # noqa: BLE001 - unreadable parameters carry no secret
        return None
    return parameters if isinstance(parameters, dict) else None


def carries_secret(parameters: dict[str, Any], secret: str) -> bool:
    """Whether request parameters hold ``secret`` (compared in constant time)."""
    given = parameters.get(SECRET_PARAMETER)
    return isinstance(given, str) and hmac.compare_digest(given.encode(), secret.encode())
