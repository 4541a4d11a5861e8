"""The Python backend's shared-memory regions in /dev/shm: which ones a server maps, made private to
their user once it is ready, and removed when no process maps them any more (a killed server leaves
them behind; Triton removes them on a clean exit only)."""

from __future__ import annotations

import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
# The Python backend's regions, and those of python_router models (a Python-based backend names its
# regions after itself: triton_python_router_backend_shm_region_*, which leaked on every stop)
SHM_PATTERN = "triton_python*_backend_shm_region_*"


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:  # removed meanwhile by its server
        return 0.0


def make_private(paths: set[Path]) -> None:
    """Mode 0600 for these files of this user: the Python backend creates its shared-memory regions 0644,
    so every local account could read the tensors and parameters in them. The processes that map them
    keep their mappings, and the backend reopens a growing region as this same user."""
    for path in paths:
        try:
            path.chmod(0o600)
        except OSError:  # gone with a stub that just died: the supervisor deals with that
            pass


def remove_stale_shm_regions(min_age_s: float = 60.0) -> list[Path]:
    """Remove the Python backend's shared-memory regions that no live process maps.

    A server killed before it could clean up leaves them (hundreds of MB each, in RAM). A region
    still mapped belongs to a live server, possibly another user's launch on this machine, and
    stays; ``min_age_s`` spares one that a starting server has created but not mapped yet."""
    regions = {path for path in SHM_DIR.glob(SHM_PATTERN) if _age_s(path) >= min_age_s}
    if not regions:
        return []
    mapped = _mapped_files()
    removed = []
    for region in sorted(regions - mapped):
        try:
            region.unlink()
            removed.append(region)
        except OSError:
            pass
    return removed


def shm_regions_of(pids: list[int]) -> set[Path]:
    """The Python-backend shared-memory regions that the processes ``pids`` map."""
    return {region for region in _mapped_files(pids) if region.match(SHM_PATTERN)}


def _mapped_files(pids: list[int] | None = None) -> set[Path]:
    """Files under SHM_DIR that the processes ``pids`` (None: all) map."""
    mapped: set[Path] = set()
    paths = Path("/proc").glob("[0-9]*/maps") if pids is None else [Path(f"/proc/{pid}/maps") for pid in pids]
    for maps in paths:
        try:
            text = maps.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split(maxsplit=5)  # address perms offset device inode [path]
            if len(fields) == 6 and fields[5].startswith(str(SHM_DIR)):
                mapped.add(Path(fields[5]))
    return mapped
