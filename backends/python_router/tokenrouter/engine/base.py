"""The step-level engine contract that every subserver drives.

An engine owns one model and its paged KV pool. The scheduler decides *which* sequences run in a
step; the engine only appends tokens to sequences and returns next-token signals. A sequence that
is not in a step keeps its KV blocks untouched for as long as it lives (that is what makes a
routed-away request "pending" for free).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Hashable, Sequence, TypeVar

import torch

if TYPE_CHECKING:
    from ..protocol import RequestSpec

SeqId = Hashable
# A step row's id type: the runtime names sequences by request id (str); engines take any SeqId.
RowId = TypeVar("RowId", bound=Hashable)


class KVCacheExhausted(RuntimeError):
    """The pool cannot hold the tokens a step asked for. Raised before any state is touched."""


class EngineLost(RuntimeError):
    """The engine can never step again (a rank of a tensor-parallel model died). Its subserver fails
    every request it holds and goes down; under Triton the stub then ends and the server restarts."""


class UnknownSequence(KeyError):
    """A step or query named a sequence the engine does not hold."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. temperature == 0 means greedy (top_p/top_k are then ignored).

    Sampling is reproducible: the random draw for the token at context position p depends only
    on (seed, p), never on batch composition or on how many draws happened before.

    ``top_p == 0`` reads as TensorRT-LLM reads it: "unset", i.e. no nucleus filter when
    ``top_k > 0`` and greedy when ``top_k == 0`` too.

    The fields after ``seed`` are TensorRT-LLM's logit processing, applied to the logits before
    temperature, top-k and top-p (``engine/logit_processing.py`` says on which tokens).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int = 0
    repetition_penalty: float = 1.0  # 1 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0  # ``end_ids`` are masked while fewer output tokens than this exist
    prompt_len: int = 0  # where output starts in the context (min_tokens counts output tokens)
    end_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), ids unique

    @classmethod
    def of_request(cls, spec: "RequestSpec") -> "SamplingParams":
        """The sampling of a request (``tokenrouter.protocol.RequestSpec``); duplicate bias ids add up."""
        bias: dict[int, float] = {}
        for token, weight in spec.logit_bias:
            bias[int(token)] = bias.get(int(token), 0.0) + float(weight)
        return cls(spec.temperature, spec.top_p, spec.top_k, spec.seed, spec.repetition_penalty,
                   spec.presence_penalty, spec.frequency_penalty, spec.min_tokens, spec.prompt_len,
                   tuple(spec.end_ids), tuple(bias.items()))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or (self.top_p == 0.0 and self.top_k == 0)

    @property
    def counts_tokens(self) -> bool:
        """Whether a penalty needs the occurrence counts of the context's tokens."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def processes_logits(self) -> bool:
        """Whether anything changes the model's logits before sampling."""
        return self.counts_tokens or self.min_tokens > 0 or bool(self.logit_bias)


@dataclass(frozen=True)
class StepRow(Generic[RowId]):
    """One sequence in a step: append ``new_tokens`` to its context, then predict the next token.

    A prefill passes the whole prompt, a decode one token, an extend the k tokens another model
    produced since this model last saw the sequence.
    """

    seq_id: RowId
    new_tokens: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class StepResult:
    """Per-row outputs of one step, in the order of the rows given to ``Engine.step``.

    ``logits`` are float32 next-token logits at each row's last position, after the row's logit
    processing (bias, penalties, min_tokens: the logits the token was sampled from; the model's own
    logits for a row that asks for none), or None when the step did not ask for them and no row's
    sampling needed them (``full_logits_needed``): a tensor-parallel engine then sends back only
    the sampled tokens, the top-k and the hidden states. Top-k, too, is of these logits. ``hidden`` is the final
    (post-norm) hidden state at that position, present when the step asked for it. ``topk_*`` hold
    the top-k logits when asked (k = ``top_logits`` of the step call).
    """

    seq_ids: list[SeqId]
    sampled: torch.Tensor  # int64 [B]
    logits: torch.Tensor | None  # float32 [B, V]; None when not asked for (see above)
    positions: torch.Tensor  # int64 [B]: context position of the sampled token (= new cached length)
    hidden: torch.Tensor | None = None  # [B, H]
    topk_values: torch.Tensor | None = None  # float32 [B, k]
    topk_indices: torch.Tensor | None = None  # int64 [B, k]

    def require_logits(self) -> torch.Tensor:
        """``logits``, or an error that says why they are missing (for the readers of the rows)."""
        if self.logits is None:
            raise RuntimeError("the step returned no logits: a policy that reads out.logits sets needs_logits = True")
        return self.logits


class Engine(abc.ABC):
    """A model with a paged KV pool, stepped by one thread at a time."""

    name: str

    # --- shape facts the runtime and admission control need -----------------------------------
    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def hidden_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def eos_token_ids(self) -> frozenset[int]: ...

    @property
    @abc.abstractmethod
    def max_model_len(self) -> int: ...

    # --- KV pool ------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def block_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def num_total_blocks(self) -> int: ...

    @property
    @abc.abstractmethod
    def num_free_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int:
        return self.num_total_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks a sequence of ``num_tokens`` tokens occupies."""
        return -(-num_tokens // self.block_size)

    def can_fit(self, num_tokens: int) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens fits in the free blocks now."""
        return num_tokens <= self.max_model_len and self.blocks_for(num_tokens) <= self.num_free_blocks

    # --- sequences ----------------------------------------------------------------------------
    @abc.abstractmethod
    def add_sequence(self, seq_id: SeqId) -> None:
        """Register an empty sequence (no blocks yet). Its first step is its prefill."""

    @abc.abstractmethod
    def has_sequence(self, seq_id: SeqId) -> bool: ...

    @abc.abstractmethod
    def num_cached(self, seq_id: SeqId) -> int:
        """Tokens of the sequence whose KV is in the pool."""

    @abc.abstractmethod
    def sequence_ids(self) -> list[SeqId]: ...

    @abc.abstractmethod
    def release(self, seq_id: SeqId) -> bool:
        """Free the sequence's blocks. Returns False when it was not held (idempotent)."""

    @abc.abstractmethod
    def step(self, rows: Sequence[StepRow], *, return_hidden: bool = False, top_logits: int = 0,
             return_logits: bool = True) -> StepResult:
        """Append each row's tokens, run one forward pass over the batch, sample each row.

        ``return_logits`` False: the result's logits are None unless a row's sampling reads the
        whole row (``full_logits_needed``); the tokens, top-k and hidden states are the same.

        Rows may mix prefill, decode and extend. Raises ``KVCacheExhausted`` (nothing changed)
        when the pool cannot hold the new tokens, ``UnknownSequence`` for an unregistered id,
        ``ValueError`` for an empty row or a duplicate id.
        """

    def close(self) -> None:
        """Free model memory. Default: nothing to do."""


def full_logits_needed(rows: Sequence[StepRow], return_logits: bool) -> bool:
    """Whether a step hands back the full-vocabulary logits: when asked, or when a row's own sampling
    reads the whole row (a random draw, logit processing; its log-probability then, too)."""
    return return_logits or any(not row.sampling.greedy or row.sampling.processes_logits for row in rows)


class LengthTable:
    """Sequence queries answered from a table of cached lengths (``self._lengths``), for engines
    whose KV pool lives elsewhere (inside vLLM, or in another process)."""

    _lengths: dict[SeqId, int]

    def has_sequence(self, seq_id: SeqId) -> bool:
        return seq_id in self._lengths

    def num_cached(self, seq_id: SeqId) -> int:
        if seq_id not in self._lengths:
            raise UnknownSequence(seq_id)
        return self._lengths[seq_id]

    def sequence_ids(self) -> list[SeqId]:
        return list(self._lengths)
