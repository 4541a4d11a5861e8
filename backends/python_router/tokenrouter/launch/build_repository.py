"""`tokenrouter build-repository CONFIG OUT`: render a Triton model repository from one YAML config."""

from __future__ import annotations

import argparse
import sys

from tokenrouter.config import ConfigError
from tokenrouter.serving.repository import INSTANCE_KINDS, render_repository


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config (models, policy, scheduling); see configs/")
    parser.add_argument("out", help="repository folder to write; an earlier rendering there is replaced")
    parser.add_argument("--instance-kind", choices=INSTANCE_KINDS, default=None,
                        help="instance_group kind of every subserver (default: from each model's device, "
                             "KIND_GPU for cuda/cuda:N pinning that GPU, else KIND_CPU)")
    parser.add_argument("--absolute-paths", action="store_true",
                        help="write model paths as absolute paths (default: relative to the repository)")


def run(args: argparse.Namespace) -> int:
    try:
        out = render_repository(args.config, args.out, instance_kind=args.instance_kind,
                                relative_paths=not args.absolute_paths)
    except ConfigError as err:
        print(f"tokenrouter build-repository: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0
