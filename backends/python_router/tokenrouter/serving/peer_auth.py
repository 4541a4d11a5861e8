"""Peer messages are for the subservers of one server only: a per-server-start secret proves it.

Triton exposes every model on its public ports, ``peer_message`` included, and has no per-model
access control. So a subserver takes a peer message only when the BLS request carries this
server start's secret as a request parameter; anything else (any client over HTTP or gRPC) is
refused before the message is even parsed.

Where the secret lives: one file per server start, mode 0600 in a folder of this user's (0700)
under the temp dir, named after tritonserver's pid and start time. Whoever comes first makes it,
the launcher right after it started tritonserver or else the first stub (tritonserver started by
hand or by an image's entrypoint); everyone else reads it: one secret per server start, never
shared across starts. It is in no process's environment, so nothing a stub starts (an engine's
worker, a tool a library runs) inherits it, and no model config or Triton API shows it.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from ..procfs import proc_stat

SECRET_PARAMETER = "tokenrouter_peer_secret"
# A front names each request it sends the entry by a key of its own choosing (new_request_key),
# passed with the secret; a "cancel" control call (control.py) names the keys to end.
REQUEST_KEY_PARAMETER = "tokenrouter_request_key"


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def new_request_key() -> str:
    """A name for one request, unguessable, so that a forged cancel could not hit it even if the
    secret check were gone."""
    return secrets.token_urlsafe(16)


def server_secret(server_pid: int | None = None, folder: Path | None = None) -> str:
    """The secret of the server start whose tritonserver is ``server_pid`` (None: this stub's
    parent); made on first use (see the module docstring)."""
    path = secret_path(os.getppid() if server_pid is None else server_pid, folder)
    private_folder(path.parent)
    _remove_secrets_of_dead_servers(path.parent)
    staging = write_private_file(path.parent / f".{path.name}.{os.getpid()}", new_secret())
    try:
        os.link(staging, path)  # atomic: the first one's secret wins, the others read it
    except FileExistsError:
        pass
    finally:
        staging.unlink()
    return path.read_text()


def private_folder(folder: Path | None = None) -> Path:
    """This user's folder for secrets (default: under the temp dir), made 0700 if new; refused unless
    it belongs to this user and no one else may enter it."""
    folder = folder or Path(tempfile.gettempdir()) / f"tokenrouter-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
        raise PermissionError(f"{folder} must belong to this user and be private (mode 0700)")
    return folder


def write_private_file(path: Path, text: str) -> Path:
    """``text`` into ``path``, readable by this user only (0600 from its creation, never a moment wider)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    return path


def secret_path(server_pid: int, folder: Path | None = None) -> Path:
    """Where the secret of tritonserver ``server_pid`` lives: its pid and start time name it, so
    a reused pid gets a new secret."""
    folder = folder or Path(tempfile.gettempdir()) / f"tokenrouter-{os.getuid()}"
    stat = proc_stat(server_pid)
    return folder / f"peer-secret-{server_pid}-{stat.start_ticks if stat else 0}"


def _remove_secrets_of_dead_servers(folder: Path) -> None:
    for stale in folder.glob("peer-secret-*"):
        pid = stale.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.unlink(missing_ok=True)


def peer_parameters(secret: str) -> dict[str, str]:
    """The request parameters that authenticate a peer message or a control call (control.py)."""
    return {SECRET_PARAMETER: secret}


def front_request_parameters(secret: str, key: str) -> dict[str, str]:
    """Parameters of a front's request to the entry subserver: the secret and the request's key."""
    return {**peer_parameters(secret), REQUEST_KEY_PARAMETER: key}


def request_parameters(request: Any) -> dict[str, Any] | None:
    """A Triton request's parameters; None when they cannot be read (the caller refuses: never
    fail open)."""
    try:
        parameters = json.loads(request.parameters() or "{}")
    except Exception:  # noqa: BLE001 - unreadable parameters carry no secret
        return None
    return parameters if isinstance(parameters, dict) else None


def is_secret(given: Any, secret: str) -> bool:
    """Whether a request parameter's value is ``secret`` (compared in constant time)."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), secret.encode())


def carries_secret(parameters: dict[str, Any], secret: str) -> bool:
    """Whether request parameters hold ``secret`` (compared in constant time)."""
    return is_secret(parameters.get(SECRET_PARAMETER), secret)
