"""Training a router head on collected features: split, train on CPU, pick the threshold.

Everything is a function of the seed: the split, the initial weights, the batch order. The epoch
with the best validation AUC is kept; the threshold is then the highest score whose validation
recall reaches the target (the lowest routing rate that still catches that share of positives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from scipy.stats import rankdata
from torch import nn
from tqdm import tqdm


def split_by_chunk(chunk_ids: torch.Tensor, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Train/validation position indices with whole chunks on one side (neighbouring positions of
    one chunk are nearly duplicates; splitting inside a chunk would flatter validation)."""
    chunks = int(chunk_ids.max()) + 1
    order = torch.randperm(chunks, generator=torch.Generator().manual_seed(seed))
    val_chunks = order[:max(1, round(chunks * val_fraction))]
    is_val = torch.isin(chunk_ids, val_chunks)
    if bool(is_val.all()):
        raise ValueError("every chunk went to validation: collect more chunks or lower --val-fraction")
    return torch.nonzero(~is_val)[:, 0], torch.nonzero(is_val)[:, 0]


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties counted half); NaN without both classes."""
    labels = labels.bool().numpy()
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if not positives or not negatives:
        return float("nan")
    ranks = rankdata(scores.double().numpy())
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


@dataclass
class ThresholdChoice:
    threshold: float
    recall: float
    precision: float
    route_rate: float  # share of positions the router sends to the large model at this threshold


def pick_threshold(scores: torch.Tensor, labels: torch.Tensor, target_recall: float) -> ThresholdChoice:
    """The largest threshold t with recall(score >= t) >= target_recall."""
    if not 0.0 < target_recall <= 1.0:
        raise ValueError(f"target recall must be in (0, 1], got {target_recall}")
    labels = labels.bool()
    positives = int(labels.sum())
    if positives == 0:
        raise ValueError("no positive labels in the validation split: cannot pick a threshold for recall")
    order = torch.argsort(scores.double(), descending=True, stable=True)
    caught = torch.cumsum(labels[order].long(), 0)
    first = int(torch.nonzero(caught >= target_recall * positives)[0, 0])
    threshold = float(scores[order[first]])
    routed = scores >= threshold  # ties with the cut score are routed too
    true_pos = int((routed & labels).sum())
    return ThresholdChoice(threshold, true_pos / positives, true_pos / max(1, int(routed.sum())),
                           float(routed.float().mean()))


@torch.no_grad()
def predict(network: nn.Module, inputs: tuple[torch.Tensor, ...], index: torch.Tensor,
            batch_size: int = 2048) -> torch.Tensor:
    network.eval()
    parts = [torch.sigmoid(network(*(x[index[s:s + batch_size]] for x in inputs)))
             for s in range(0, len(index), batch_size)]
    return torch.cat(parts)


@dataclass
class TrainResult:
    best_epoch: int
    val_auc: float
    train_auc: float
    val_scores: torch.Tensor


def train_network(network: nn.Module, inputs: tuple[torch.Tensor, ...], labels: torch.Tensor, train: torch.Tensor,
                  val: torch.Tensor, *, epochs: int, batch_size: int, lr: float, weight_decay: float, seed: int,
                  desc: str) -> TrainResult:
    """AdamW on binary cross-entropy; keeps the parameters of the epoch with the best validation AUC
    (lowest validation loss when the validation labels are all one class and AUC is undefined)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(network.parameters(), lr=lr, weight_decay=weight_decay)
    loss_fn = nn.BCEWithLogitsLoss()
    targets = labels.float()
    best = (-math.inf, 0, {name: p.detach().clone() for name, p in network.named_parameters()})
    steps = -(-len(train) // batch_size)
    with tqdm(total=epochs * steps, desc=desc, unit="step", dynamic_ncols=True) as bar:
        for epoch in range(1, epochs + 1):
            network.train()
            order = train[torch.randperm(len(train), generator=generator)]
            for start in range(0, len(order), batch_size):
                batch = order[start:start + batch_size]
                loss = loss_fn(network(*(x[batch] for x in inputs)), targets[batch])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                bar.update(1)
            scores = predict(network, inputs, val)
            auc = roc_auc(scores, labels[val])
            val_loss = float(nn.functional.binary_cross_entropy(scores, targets[val]))
            bar.set_postfix(epoch=epoch, val_loss=f"{val_loss:.3f}", val_auc=f"{auc:.4f}")
            merit = auc if not math.isnan(auc) else -val_loss
            if merit > best[0]:
                best = (merit, epoch, {name: p.detach().clone() for name, p in network.named_parameters()})
    with torch.no_grad():
        for name, param in network.named_parameters():
            param.copy_(best[2][name])
    train_auc = roc_auc(predict(network, inputs, train), labels[train])
    val_scores = predict(network, inputs, val)
    return TrainResult(best[1], roc_auc(val_scores, labels[val]), train_auc, val_scores)
