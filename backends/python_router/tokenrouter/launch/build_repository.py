"""`tokenrouter build-repository CONFIG OUT`: render a Triton model repository from one YAML config.

With ``--only``, one node's repository of a config whose models run on several servers; with
``--agree-with``, only if another node's config or repository describes the same deployment
(placement.py): a difference is refused, naming every value that differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenrouter.config import ConfigError, TokenRouterConfig, load_config
from tokenrouter.placement import describe, differences, node_models
from tokenrouter.serving.repository import INSTANCE_KINDS, read_repository, render_repository, served_models


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config (models, policy, scheduling); see configs/")
    parser.add_argument("out", help="repository folder to write; an earlier rendering there is replaced")
    parser.add_argument("--instance-kind", choices=INSTANCE_KINDS, default=None,
                        help="instance_group kind of every subserver (default: from each model's device, "
                             "KIND_GPU for cuda/cuda:N pinning that GPU, else KIND_CPU)")
    parser.add_argument("--absolute-paths", action="store_true",
                        help="write model paths as absolute paths (default: relative to the repository)")
    parser.add_argument("--only", type=lambda text: text.split(","), metavar="MODEL[,MODEL]",
                        help="one node's repository: the models that share one models.<name>.server (and the "
                             "fronts when the entry model is one of them)")
    parser.add_argument("--agree-with", type=Path, metavar="CONFIG_OR_REPOSITORY",
                        help="another node's config (YAML) or rendered repository: refuse to render unless both "
                             "describe the same deployment")


def check_agreement(config: TokenRouterConfig, here: list[str], other: Path) -> None:
    """Raise ConfigError naming every value in which ``other`` (a config file or a rendered
    repository of another node) describes another deployment than ``config``."""
    if other.is_dir():
        theirs, there = read_repository(other), served_models(other)
    else:
        theirs = load_config(other)
        there = theirs.model_names
    found = differences(describe(config, here), describe(theirs, there), mine="in this config", theirs=f"in {other}")
    if found:
        raise ConfigError(f"{other} describes another deployment:\n  " + "\n  ".join(found))


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        if args.agree_with:
            check_agreement(config, node_models(config, args.only), args.agree_with)
        out = render_repository(config, args.out, instance_kind=args.instance_kind,
                                relative_paths=not args.absolute_paths, only=args.only)
    except ConfigError as err:
        print(f"tokenrouter build-repository: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0
