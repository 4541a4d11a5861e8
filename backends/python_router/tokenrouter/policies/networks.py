"""Router networks for the learned policies, and their on-disk format.

- ``R2RRouter``: R2R's router (SLM last hidden state + embedding of the sampled token from the
  SLM's frozen embedding table + top-k raw logits through Linear(k -> H); concatenated, projected
  to ``d_model``, pre-LN residual MLP blocks, LayerNorm, Linear -> 1). The paper's router is
  d_model 1024 with six blocks (~55M parameters) for a 0.6B/32B pair; the defaults here are sized
  for Qwen2.5-Coder 0.5B/1.5B so that CPU training takes minutes.
- ``HiddenStateHead``: a small MLP on the SLM hidden state (CITER's confidence classifier,
  Co-LLM's deferral head).

Every network returns one logit per row; ``sigmoid(logit)`` is the probability that the position
should go to the large model. A trained router is a directory holding ``model.safetensors`` and
``metadata.json`` (architecture, threshold, training information); ``load_router`` rebuilds the
network from the architecture and refuses anything that does not match.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .base import PolicyError

FORMAT = "tokenrouter-router/1"
WEIGHTS_FILE = "model.safetensors"
METADATA_FILE = "metadata.json"


def mlp(in_dim: int, width: int, depth: int, out_dim: int) -> nn.Sequential:
    """``depth`` hidden layers of ``width`` with GELU, then a linear output (depth 0 = linear)."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(in_dim, width), nn.GELU()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class ResidualBlock(nn.Module):
    """Pre-LN residual MLP block: x + MLP(LN(x)), MLP = d -> expansion*d -> d."""

    def __init__(self, d_model: int, expansion: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.mlp = mlp(d_model, expansion * d_model, 1, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class R2RRouter(nn.Module):
    """Divergence router on (hidden state, sampled-token embedding, top-k logits)."""

    def __init__(self, hidden_size: int, vocab_size: int, top_k: int = 100, d_model: int = 256, depth: int = 2,
                 expansion: int = 4) -> None:
        super().__init__()
        self.top_k = top_k
        # The SLM's own input embeddings, frozen; kept in float16 to halve the router file.
        self.register_buffer("token_embedding", torch.zeros(vocab_size, hidden_size, dtype=torch.float16))
        # Per-stream LayerNorms: the SLM's hidden state has a few huge outlier channels and its
        # embeddings are tiny; normalizing each stream keeps one from drowning the others.
        self.hidden_norm = nn.LayerNorm(hidden_size)
        self.embedding_norm = nn.LayerNorm(hidden_size)
        self.logits_proj = nn.Linear(top_k, hidden_size)
        self.input_proj = nn.Linear(3 * hidden_size, d_model)
        self.blocks = nn.Sequential(*(ResidualBlock(d_model, expansion) for _ in range(depth)))
        self.out_norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 1)

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor, topk_logits: torch.Tensor) -> torch.Tensor:
        """hidden [B, H], tokens [B] (sampled ids), topk_logits [B, k] sorted descending -> logit [B]."""
        embedded = self.token_embedding[tokens].float()
        # Logits relative to the top-1: softmax is shift-invariant, so this keeps every
        # log-probability ratio the router needs and drops an arbitrary per-row offset.
        relative = topk_logits.float() - topk_logits[:, :1].float()
        x = torch.cat([self.hidden_norm(hidden.float()), self.embedding_norm(embedded), self.logits_proj(relative)], -1)
        return self.head(self.out_norm(self.blocks(self.input_proj(x)))).squeeze(-1)


class HiddenStateHead(nn.Module):
    """LayerNorm + MLP on the SLM's last hidden state -> logit (CITER, Co-LLM)."""

    def __init__(self, hidden_size: int, width: int = 256, depth: int = 2) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.mlp = mlp(hidden_size, width, depth, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(hidden.float())).squeeze(-1)


ARCHITECTURES: dict[str, type[nn.Module]] = {"r2r": R2RRouter, "hidden_head": HiddenStateHead}


def build_network(architecture: dict[str, Any]) -> nn.Module:
    """The network an architecture dict describes: ``{"kind": ..., <constructor arguments>}``."""
    arch = dict(architecture)
    kind = arch.pop("kind", None)
    if kind not in ARCHITECTURES:
        raise PolicyError(f"unknown router architecture {kind!r}; allowed: {', '.join(sorted(ARCHITECTURES))}")
    try:
        return ARCHITECTURES[kind](**arch)
    except TypeError as exc:
        raise PolicyError(f"router architecture {architecture}: {exc}") from None


def count_parameters(network: nn.Module) -> int:
    """Trainable parameters (the frozen embedding table is a buffer and not counted)."""
    return sum(p.numel() for p in network.parameters())


@dataclass
class LoadedRouter:
    network: nn.Module
    metadata: dict[str, Any]

    @property
    def threshold(self) -> float:
        return float(self.metadata["threshold"])

    @property
    def architecture(self) -> dict[str, Any]:
        return dict(self.metadata["architecture"])

    @property
    def hidden_size(self) -> int:
        return int(self.metadata["architecture"]["hidden_size"])


def save_router(directory: str | Path, network: nn.Module, metadata: dict[str, Any]) -> Path:
    """Write ``model.safetensors`` + ``metadata.json`` into ``directory``; returns the directory."""
    for key in ("algorithm", "architecture", "threshold"):
        if key not in metadata:
            raise ValueError(f"router metadata needs '{key}'")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().contiguous() for name, tensor in network.state_dict().items()}
    # One header entry only: safetensors writes its metadata map in no fixed order, and the same
    # seed must give the same bytes (the algorithm is in metadata.json).
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": FORMAT})
    full = {"format": FORMAT, "weights_file": WEIGHTS_FILE, **metadata}
    (directory / METADATA_FILE).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
    return directory


def load_router(path: str | Path | None, algorithm: str) -> LoadedRouter:
    """Load a router written by ``save_router`` for ``algorithm``; a clear error for anything wrong."""
    if path is None:
        raise PolicyError(f"policy '{algorithm}' needs trained weights: run `tokenrouter train-router --algo "
                          f"{algorithm}` and set policy.weights to its output directory")
    directory = Path(path)
    if directory.is_file() and directory.name in (METADATA_FILE, WEIGHTS_FILE):
        directory = directory.parent
    meta_path, weights_path = directory / METADATA_FILE, directory / WEIGHTS_FILE
    for needed in (meta_path, weights_path):
        if not needed.is_file():
            raise PolicyError(f"policy '{algorithm}': router weights incomplete, missing {needed}")
    try:
        metadata = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise PolicyError(f"policy '{algorithm}': {meta_path} is not valid JSON ({exc})") from None
    if metadata.get("format") != FORMAT:
        raise PolicyError(f"policy '{algorithm}': {meta_path} has format {metadata.get('format')!r}, "
                          f"expected {FORMAT!r}")
    if metadata.get("algorithm") != algorithm:
        raise PolicyError(f"policy '{algorithm}': {directory} holds a router trained for "
                          f"{metadata.get('algorithm')!r}, not {algorithm!r}")
    network = build_network(metadata["architecture"])
    try:
        network.load_state_dict(load_file(str(weights_path)), strict=True)
    except RuntimeError as exc:
        raise PolicyError(f"policy '{algorithm}': {weights_path} does not match its architecture "
                          f"{metadata['architecture']}: {exc}") from None
    network.eval().requires_grad_(False)
    return LoadedRouter(network, metadata)
