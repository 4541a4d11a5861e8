"""The PyTorch engine: a transformers model whose attention reads and writes a paged KV pool.

One ``step`` packs every row's new tokens (prefill, decode or extend alike) into one sequence,
runs the decoder once, applies the LM head only at each row's last position and samples. A
sequence that sits out steps keeps its blocks untouched, so resuming it costs only its new tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from transformers import PreTrainedModel

from .base import SeqId, StepResult, StepRow
from .dtypes import resolve_dtype
from .loader import eos_token_ids_of, load_causal_lm, resolve_device
from .paged_attention import ATTN_IMPLEMENTATION, LAYOUT_KWARG, PagedKVCache, StepLayout
from .pooled import PooledEngine, sampled_result
from .threads import IntraOpThreads

if TYPE_CHECKING:  # the engine itself needs only torch and transformers (tools/gpu_check.py relies on it)
    from ..config import ModelSpec


class TorchEngine(PooledEngine):
    def __init__(self, name: str, model: PreTrainedModel, *, num_blocks: int, block_size: int,
                 threads: int | None = None) -> None:
        self.name = name
        self.model = model
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        self.threads = threads
        config = model.config
        self._device = next(model.parameters()).device
        self._dtype = next(model.parameters()).dtype
        self._config = config
        super().__init__(num_blocks, block_size)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self._cache: PagedKVCache | None = PagedKVCache(config.num_hidden_layers, num_blocks, block_size,
                                                        config.num_key_value_heads, head_dim, self._dtype,
                                                        self._device)
        self._eos = eos_token_ids_of(getattr(model, "generation_config", None), model.config)
        self._intra_op = IntraOpThreads(threads)

    @classmethod
    def from_spec(cls, name: str, spec: ModelSpec) -> "TorchEngine":
        if spec.path is None:
            raise ValueError(f"model '{name}': the torch engine needs a path")
        caller_threads = torch.get_num_threads()
        if spec.threads:
            torch.set_num_threads(spec.threads)  # loading (GGUF dequantization) runs on the same budget
        try:
            model = load_causal_lm(spec.path, resolve_dtype(spec, on_gpu=False), resolve_device(spec.device))
        finally:
            torch.set_num_threads(caller_threads)  # the loading thread's own setting is not ours to keep
        num_blocks = max(1, spec.kv_cache_tokens // spec.block_size)
        return cls(name, model, num_blocks=num_blocks, block_size=spec.block_size, threads=spec.threads)

    # --- shape facts ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._config.vocab_size

    @property
    def hidden_size(self) -> int:
        return self._config.hidden_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def max_model_len(self) -> int:
        return self._config.max_position_embeddings

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    # --- KV pool ----------------------------------------------------------------------------------
    def blocks_needed(self, seq_id: SeqId, extra_tokens: int) -> int:
        """New blocks that appending ``extra_tokens`` to a held sequence would take."""
        return self._pool.blocks_needed(seq_id, extra_tokens)

    def block_table(self, seq_id: SeqId) -> list[int]:
        """A copy of the sequence's block ids, in context order (for tests and diagnostics)."""
        return list(self._pool.block_table(seq_id))

    def cached_kv(self, seq_id: SeqId, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the sequence's cached keys and values in ``layer``, each [num_cached, kv_heads, head_dim]."""
        slots = torch.tensor(self._pool.slots(seq_id, 0, self._pool.length(seq_id)), dtype=torch.long,
                             device=self._device)
        cache = self._live_cache
        keys, values = (pool[layer].flatten(0, 1)[slots].cpu() for pool in (cache.keys, cache.values))
        return keys, values

    # --- the step -------------------------------------------------------------------------------
    def step(self, rows: Sequence[StepRow], *, return_hidden: bool = False, top_logits: int = 0,
             return_logits: bool = True) -> StepResult:
        self._check_attention()
        self.check_rows(rows, top_logits)
        self._intra_op.apply()
        starts = [self._pool.length(row.seq_id) for row in rows]
        self._pool.append({row.seq_id: len(row.new_tokens) for row in rows})  # all or nothing
        try:
            return self._forward(rows, starts, return_hidden, top_logits, return_logits)
        except BaseException:
            # The forward failed after allocation: forget the new tokens (their slots may hold
            # partial writes, but no cached position points at them any more).
            for row, start in zip(rows, starts):
                self._pool.truncate(row.seq_id, start)
            raise

    @torch.no_grad()  # not inference_mode: callers may feed results to modules that record autograd
    def _forward(self, rows: Sequence[StepRow], starts: list[int], return_hidden: bool,
                 top_logits: int, return_logits: bool) -> StepResult:
        counts = [len(row.new_tokens) for row in rows]
        layout = StepLayout.build(
            self._live_cache, [self._pool.block_table(row.seq_id) for row in rows], starts, counts,
            self._pool.block_size, self._device,
        )
        input_ids = torch.tensor([t for row in rows for t in row.new_tokens], dtype=torch.long, device=self._device)
        out = self.model.model(
            input_ids=input_ids[None], position_ids=layout.positions[None], use_cache=False,
            **{LAYOUT_KWARG: layout},
        )
        hidden = out.last_hidden_state[0, layout.last_index]  # [R, H], post-norm
        logits = self.model.lm_head(hidden).float()
        positions = [start + count for start, count in zip(starts, counts)]
        return sampled_result(rows, logits, positions, top_logits, hidden if return_hidden else None,
                              counts=self._context_counts, return_logits=return_logits)

    @property
    def _live_cache(self) -> PagedKVCache:
        """The KV pool, until close() lets it go."""
        if self._cache is None:
            raise RuntimeError(f"engine '{self.name}' is closed")
        return self._cache

    def _check_attention(self) -> None:
        if self._config._attn_implementation != ATTN_IMPLEMENTATION:
            raise RuntimeError(f"engine '{self.name}': the model's attention was switched away from the paged hook")

    def close(self) -> None:
        self.release_all()
        self._cache = None
        self.model = None
