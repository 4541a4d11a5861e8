"""One tensor schema for every model of the repository and for clients: names, dtypes, dims, encoders.

The repository renderer declares these tensors, the models read and write them, and
``tokenrouter.client`` builds requests from them, so a name means the same dtype and shape
everywhere. Dims are without Triton's batch dimension (every model here has max_batch_size > 0).
numpy only: clients import this module without Triton or torch.

The client interface is TensorRT-LLM's (tensorrtllm_backend c2e65b88,
``all_models/inflight_batcher_llm``): every input its ``ensemble`` and ``tensorrt_llm_bls``
declare, with their names, dtypes and dims, and every output, plus ours (``output_ids``,
``output_models``, ``finish_reason``, ``large_model_share``). What each one does here is in
docs/compatibility.md; the front (front_request.py) refuses by name those that have no meaning here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

NUMPY = {"BYTES": np.object_, "BOOL": np.bool_, "UINT8": np.uint8, "INT32": np.int32, "INT64": np.int64,
         "UINT64": np.uint64, "FP16": np.float16, "FP32": np.float32}


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str  # Triton's wire name (BYTES, INT32, ...), as tritonclient's InferInput takes it
    dims: tuple[int, ...]  # without the batch dimension

    @property
    def numpy(self) -> type:
        return NUMPY[self.datatype]

    @property
    def config_type(self) -> str:
        """The model_config DataType name: TYPE_STRING for BYTES, else TYPE_<datatype>."""
        return "TYPE_STRING" if self.datatype == "BYTES" else f"TYPE_{self.datatype}"

    def row(self, values: object) -> np.ndarray:
        """One batch row ``[1, ...]`` of this tensor: a scalar or a list becomes ``[1, n]``."""
        array = np.array(values if isinstance(values, (list, tuple, np.ndarray)) else [values], dtype=self.numpy)
        return array.reshape(1, -1) if len(self.dims) <= 1 else array[None]


def _tensors(*specs: tuple[str, str, tuple[int, ...]]) -> dict[str, Tensor]:
    return {name: Tensor(name, datatype, dims) for name, datatype, dims in specs}


ONE = (1,)
ANY = (-1,)

# --- the client interface ------------------------------------------------------------------------
CLIENT_INPUTS = _tensors(
    ("text_input", "BYTES", ONE),
    ("decoder_text_input", "BYTES", ONE),
    ("image_input", "FP16", (-1, 3, -1, -1)),
    ("image_bytes_input", "UINT8", (-1, -1, -1, -1)),
    ("image_url_input", "BYTES", ONE),
    ("video_bytes_input", "UINT8", (-1, -1, -1, -1)),
    ("max_tokens", "INT32", ONE),
    ("num_return_sequences", "INT32", ONE),
    ("bad_words", "BYTES", ANY),
    ("stop_words", "BYTES", ANY),
    ("exclude_input_in_output", "BOOL", ONE),
    ("end_id", "INT32", ANY),  # TensorRT-LLM declares [1]; several end ids are allowed here
    ("pad_id", "INT32", ONE),
    ("top_k", "INT32", ONE),
    ("top_p", "FP32", ONE),
    ("temperature", "FP32", ONE),
    ("length_penalty", "FP32", ONE),
    ("repetition_penalty", "FP32", ONE),
    ("min_tokens", "INT32", ONE),
    ("presence_penalty", "FP32", ONE),
    ("frequency_penalty", "FP32", ONE),
    ("seed", "UINT64", ONE),
    ("random_seed", "UINT64", ONE),  # TensorRT-LLM's older name of seed
    ("return_log_probs", "BOOL", ONE),
    ("return_context_logits", "BOOL", ONE),
    ("return_generation_logits", "BOOL", ONE),
    ("return_perf_metrics", "BOOL", ONE),
    ("beam_width", "INT32", ONE),
    ("stream", "BOOL", ONE),
    ("prompt_embedding_table", "FP16", (-1, -1)),
    ("prompt_table_extra_id", "UINT64", ONE),
    ("prompt_vocab_size", "INT32", ONE),
    ("embedding_bias_words", "BYTES", ANY),
    ("embedding_bias_weights", "FP32", ANY),
    ("num_draft_tokens", "INT32", ONE),
    ("use_draft_logits", "BOOL", ONE),
    ("lora_task_id", "UINT64", ONE),
    ("lora_weights", "FP16", (-1, -1)),
    ("lora_config", "INT32", (-1, 3)),
    ("guided_decoding_guide_type", "BYTES", ONE),
    ("guided_decoding_guide", "BYTES", ONE),
    ("return_num_input_tokens", "BOOL", ONE),  # Triton's OpenAI frontend sends both, for usage
    ("return_num_output_tokens", "BOOL", ONE),
    # ours
    ("apply_chat_template", "BOOL", ONE),  # default: the front's chat_template; false: text_input as is
)
# A front parameter of the input's name gives its default (config frontend.exclude_input_in_output), as
# TensorRT-LLM's tensorrt_llm model has one.
EXCLUDE_INPUT = "exclude_input_in_output"
CLIENT_OUTPUTS = _tensors(
    ("text_output", "BYTES", ANY),  # one string per row and sequence: as_numpy("text_output")[0]
    ("cum_log_probs", "FP32", ANY),
    ("output_log_probs", "FP32", (-1, -1)),
    ("context_logits", "FP32", (-1, -1)),
    ("generation_logits", "FP32", (-1, -1, -1)),
    ("batch_index", "INT32", ONE),
    ("sequence_index", "INT32", ONE),
    ("kv_cache_alloc_new_blocks", "INT32", ONE),
    ("kv_cache_reused_blocks", "INT32", ONE),
    ("kv_cache_alloc_total_blocks", "INT32", ONE),
    ("arrival_time_ns", "INT64", ONE),
    ("first_scheduled_time_ns", "INT64", ONE),
    ("first_token_time_ns", "INT64", ONE),
    ("last_token_time_ns", "INT64", ONE),
    ("acceptance_rate", "FP32", ONE),
    ("total_accepted_draft_tokens", "INT32", ONE),
    ("total_draft_tokens", "INT32", ONE),
    ("num_input_tokens", "INT32", ONE),  # the prompt's tokens (return_num_input_tokens)
    ("num_output_tokens", "INT32", ONE),  # this response's output tokens (return_num_output_tokens)
    # ours
    ("output_ids", "INT32", ANY),  # the generated tokens of this response (never the prompt)
    ("output_models", "BYTES", ANY),  # the model that produced each of output_ids
    ("finish_reason", "BYTES", ONE),  # "" until the last response
    ("large_model_share", "FP32", ONE),  # of all output so far: tokens not from the entry model
)

# --- the subserver interface (token level; the front calls the entry subserver with it) ---------
SUBSERVER_INPUTS = _tensors(
    ("input_ids", "INT32", ANY),
    ("max_tokens", "INT32", ONE),
    ("temperature", "FP32", ONE),
    ("top_p", "FP32", ONE),
    ("top_k", "INT32", ONE),
    ("seed", "UINT64", ONE),
    ("repetition_penalty", "FP32", ONE),
    ("presence_penalty", "FP32", ONE),
    ("frequency_penalty", "FP32", ONE),
    ("min_tokens", "INT32", ONE),
    ("return_log_probs", "BOOL", ONE),
    ("stream", "BOOL", ONE),
    ("end_id", "INT32", ANY),
    ("stop_ids", "INT32", ANY),  # stop sequences, each followed by -1 (flatten_sequences)
    ("bad_ids", "INT32", ANY),  # bad-word sequences, the same way
    ("logit_bias_ids", "INT32", ANY),  # with logit_bias_weights: (token id, added to its logit) pairs
    ("logit_bias_weights", "FP32", ANY),
    ("peer_message", "BYTES", ONE),  # subserver to subserver, and control calls (peer_auth.py)
)
PEER_INPUT = "peer_message"  # the one a peer message or a control call travels in (no other input with it)
# How many of the tokens emitted before a chunk travel with it as prefix_ids: a character has at
# most 4 bytes, so a held-back partial character always fits (text/detokenize.py).
PREFIX_TOKENS = 8
SUBSERVER_OUTPUTS = _tensors(
    ("output_ids", "INT32", ANY),
    ("prefix_ids", "INT32", ANY),  # up to PREFIX_TOKENS tokens before the chunk (UTF-8 safe decoding)
    ("output_models", "BYTES", ANY),
    ("output_log_probs", "FP32", ANY),  # one per output_ids token when return_log_probs, else empty
    ("finish_reason", "BYTES", ONE),
    ("large_model_share", "FP32", ONE),
    ("is_final", "BOOL", ONE),
    # only in the final response of a front's request that failed (finish_reason "error"): see error_codes.py
    ("error", "BYTES", ONE),
    ("error_code", "BYTES", ONE),
)
# The RequestSpec field behind each scalar subserver input, converted with .item(); the front
# fills them from the client's inputs of the same names, the entry's intake reads them back.
SPEC_SCALARS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty", "presence_penalty",
                "frequency_penalty", "min_tokens", "return_log_probs")

# --- the standalone text models, for clients that tokenize or detokenize on their own -----------
PREPROCESSING_INPUTS = {name: CLIENT_INPUTS[name] for name in (
    "text_input", "stop_words", "bad_words", "end_id", "embedding_bias_words", "embedding_bias_weights")}
PREPROCESSING_OUTPUTS = {name: SUBSERVER_INPUTS[name] for name in (
    "input_ids", "stop_ids", "bad_ids", "end_id", "logit_bias_ids", "logit_bias_weights")}
POSTPROCESSING_INPUTS = {name: t for name, t in SUBSERVER_OUTPUTS.items()
                         if name not in ("output_log_probs", "error", "error_code")}
POSTPROCESSING_OUTPUTS = {name: CLIENT_OUTPUTS[name] for name in (
    "text_output", "output_ids", "output_models", "finish_reason", "large_model_share")}

ROUTING_POLICY_OUTPUTS = _tensors(("policy", "BYTES", ONE))  # the routing config carrier's answer, as JSON


def flatten_sequences(sequences: Iterable[Sequence[int]]) -> list[int]:
    """Token sequences as one flat list, each followed by -1 (stop_ids, bad_ids)."""
    return [token for sequence in sequences for token in (*sequence, -1)]


def split_sequences(flat: Iterable[int]) -> list[list[int]]:
    """The inverse of flatten_sequences; empty sequences are dropped."""
    sequences: list[list[int]] = []
    current: list[int] = []
    for token in flat:
        if token == -1:
            if current:
                sequences.append(current)
            current = []
        else:
            current.append(int(token))
    if current:
        sequences.append(current)
    return sequences
