"""Where each model runs, and what two servers of one deployment must agree on.

By default every model runs in one Triton server. A config whose models name a ``server``
(``models.llm.server: "gpu-node-2:8001"``, the gRPC address the other servers reach it at) is one
deployment over several servers: the models that share an address form one *node*, each node is
one ``tokenrouter serve --only ...``, and the node that runs the entry model also runs the fronts.

Two nodes agree when they were given the same deployment: the same models in the same order, the
same checkpoints (by folder name), tokenizer (by the digest of its tokenizer.json), policy (its
weights by digest), scheduling and context limit. What a node decides alone is left out: devices,
cores, threads, GPU memory share, tensor-parallel ranks, where files live on its disk, the fronts it
alone serves, its transport's TLS files and injected delay. ``describe`` gives a node's view; ``differences`` names
every value in which two views differ, so a refusal says which one (peers compare at connect time,
``build-repository --agree-with`` at render time).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from .config import ConfigError, TokenRouterConfig

# Chosen per host: another node may differ in them and still be the same deployment.
NODE_LOCAL_FIELDS = frozenset({"device", "cpus", "threads", "gpu_memory_utilization", "tensor_parallel_size"})
TOKENIZER_FILE = "tokenizer.json"


def nodes(config: TokenRouterConfig) -> dict[str, list[str]]:
    """Server address -> the models it runs, in model order; {} when everything runs in one server."""
    placed: dict[str, list[str]] = {}
    for name, spec in config.models.items():
        if spec.server is not None:
            placed.setdefault(spec.server, []).append(name)
    return placed


def node_models(config: TokenRouterConfig, only: Sequence[str] | None) -> list[str]:
    """The models one server runs: all of them (``only`` None), or exactly one node's models."""
    if not only:
        return config.model_names
    unknown = [name for name in only if name not in config.models]
    if unknown:
        raise ConfigError(f"--only {', '.join(unknown)}: not a model of this config ({', '.join(config.model_names)})")
    placed = nodes(config)
    if not placed:
        raise ConfigError("--only needs a config whose models say where they run (models.<name>.server: HOST:PORT); "
                          "without one every model runs in this server")
    addresses = {address for address, names in placed.items() if set(names) & set(only)}  # every model is placed
    if len(addresses) > 1:
        raise ConfigError(f"--only {', '.join(only)}: these models run on different servers "
                          f"({', '.join(sorted(addresses))}); serve each node on its own")
    (address,) = addresses
    if sorted(only) != sorted(placed[address]):
        raise ConfigError(f"models {', '.join(placed[address])} share server {address}: serve them together "
                          f"(--only {','.join(placed[address])})")
    return placed[address]


def describe(config: TokenRouterConfig, here: Sequence[str]) -> dict[str, Any]:
    """This node's view of the deployment, as flat ``dotted.name -> value`` (JSON values). ``here``:
    the models this node runs (whose folders it has, for the tokenizer's digest)."""
    view: dict[str, Any] = {"models": config.model_names, "entry": config.entry,
                            "max_model_len": config.max_model_len, "tokenizer": _tokenizer_digest(config, here)}
    for name, spec in config.models.items():
        for key, value in spec.model_dump().items():
            if key not in NODE_LOCAL_FIELDS:
                view[f"models.{name}.{key}"] = Path(value).name if key == "path" and value else value
    view["policy.name"] = config.policy.name
    view["policy.params"] = config.policy.params
    view["policy.weights"] = file_digest(Path(config.policy.weights)) if config.policy.weights else None
    for key, value in config.scheduling.model_dump().items():
        view[f"scheduling.{key}"] = value
    return json.loads(json.dumps(view, sort_keys=True))  # as it arrives from a peer: tuples are lists


def differences(here: dict[str, Any], there: dict[str, Any], *, mine: str = "here",
                theirs: str = "there") -> list[str]:
    """Every value in which two views differ, as ``name: X <mine>, Y <theirs>`` (``mine`` and
    ``theirs`` say whose view each is, e.g. "at 'llm' (gpu-node-2:8001)"). A digest one side could
    not take (a file it does not have) is not compared."""
    found = []
    for key in sorted(set(here) | set(there)):
        value, other = here.get(key), there.get(key)
        if key in ("tokenizer", "policy.weights") and (value is None or other is None):
            continue
        if value != other:
            found.append(f"{key}: {json.dumps(value)} {mine}, {json.dumps(other)} {theirs}")
    return found


def _tokenizer_digest(config: TokenRouterConfig, here: Sequence[str]) -> str | None:
    """The digest of the tokenizer this node has: the config's, or else one of its own models'
    (a node that runs only the large model may not have the entry model's folder)."""
    candidates = [config.tokenizer_path] + [config.models[name].path for name in here]
    for candidate in candidates:
        if candidate and (Path(candidate) / TOKENIZER_FILE).is_file():
            return file_digest(Path(candidate) / TOKENIZER_FILE)
    return None


def file_digest(path: Path) -> str | None:
    """sha256 of a file, or of a folder's files (names and contents, sorted); None if absent."""
    if not path.exists():
        return None
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path)).encode() if file != path else b"")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
