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
        listed = values if isinstance(values, (list, tuple, np.ndarray)) else [values]
        array: np.ndarray = np.array(listed, dtype=self.numpy)
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
# The core model parameter of config frontend.out_of_vocabulary_ids: "refuse" (the default) or "wrap".
OUT_OF_VOCABULARY = "out_of_vocabulary_ids"
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

# --- control calls (control.py): every subserver, front and core model declares this input ------
CONTROL_INPUT = "control"
CONTROL_INPUTS = _tensors((CONTROL_INPUT, "BYTES", ONE))

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
    ("end_id", "INT32", ANY),  # none sent: the model's end ids; [NO_END_ID]: none at all
    ("stop_ids", "INT32", ANY),  # stop sequences, each followed by -1 (flatten_sequences)
    ("bad_ids", "INT32", ANY),  # bad-word sequences, the same way
    ("logit_bias_ids", "INT32", ANY),  # with logit_bias_weights: (token id, added to its logit) pairs
    ("logit_bias_weights", "FP32", ANY),
    ("peer_message", "BYTES", ONE),  # subserver to subserver (peer_auth.py, peer_sessions.py)
) | CONTROL_INPUTS
NO_END_ID = -1  # end_id [-1]: the generation ends by length or a stop word only (TensorRT-LLM's end_id -1)
PEER_INPUT = "peer_message"  # the one a batch of peer messages travels in (no other input with it)
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
# A front's request parameter (with its value "true") that asks the entry for one token per streamed
# response, unpaced (front parameter of the same name; config frontend.one_token_per_response)
ONE_TOKEN_PER_RESPONSE = "one_token_per_response"
# The RequestSpec field behind each scalar subserver input, converted with .item(); the front
# fills them from the client's inputs of the same names, the entry's intake reads them back.
SPEC_SCALARS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty", "presence_penalty",
                "frequency_penalty", "min_tokens", "return_log_probs")

# --- TensorRT-LLM's core model (``tensorrt_llm``): token ids in, token ids out -----------------
# Every input its config declares at tensorrtllm_backend c2e65b88 (names, dtypes, dims), plus two older
# names its tools still send; front/core_request.py reads them or refuses them by name.
CORE_MODEL_INPUTS = _tensors(
    ("input_ids", "INT32", ANY),
    ("input_lengths", "INT32", ONE),
    ("request_output_len", "INT32", ONE),
    ("num_return_sequences", "INT32", ONE),
    ("end_id", "INT32", ONE),
    ("pad_id", "INT32", ONE),
    ("stop_words_list", "INT32", (2, -1)),
    ("bad_words_list", "INT32", (2, -1)),
    ("embedding_bias", "FP32", ANY),
    ("beam_width", "INT32", ONE),
    ("temperature", "FP32", ONE),
    ("runtime_top_k", "INT32", ONE),
    ("runtime_top_p", "FP32", ONE),
    ("runtime_top_p_min", "FP32", ONE),
    ("runtime_top_p_decay", "FP32", ONE),
    ("runtime_top_p_reset_ids", "INT32", ONE),
    ("len_penalty", "FP32", ONE),
    ("early_stopping", "BOOL", ONE),
    ("repetition_penalty", "FP32", ONE),
    ("min_tokens", "INT32", ONE),
    ("min_length", "INT32", ONE),  # the older name of min_tokens (identity_test.py's helpers)
    ("beam_search_diversity_rate", "FP32", ONE),
    ("presence_penalty", "FP32", ONE),
    ("frequency_penalty", "FP32", ONE),
    ("seed", "UINT64", ONE),
    ("random_seed", "UINT64", ONE),  # the older name of seed
    ("return_log_probs", "BOOL", ONE),
    ("return_context_logits", "BOOL", ONE),
    ("return_generation_logits", "BOOL", ONE),
    ("return_perf_metrics", "BOOL", ONE),
    ("exclude_input_in_output", "BOOL", ONE),
    ("stop", "BOOL", ONE),
    ("streaming", "BOOL", ONE),
    ("decoder_input_ids", "INT32", ANY),
    ("decoder_input_lengths", "INT32", ONE),
    ("encoder_input_features", "FP16", (-1, -1)),
    ("encoder_output_lengths", "INT32", ONE),
    ("draft_input_ids", "INT32", ANY),
    ("draft_logits", "FP32", (-1, -1)),
    ("draft_acceptance_threshold", "FP32", ONE),
    ("prompt_embedding_table", "FP16", (-1, -1)),
    ("prompt_table_extra_ids", "UINT64", ANY),
    ("prompt_vocab_size", "INT32", ONE),
    ("cross_attention_mask", "BOOL", (-1, -1)),
    ("mrope_rotary_cos_sin", "FP32", ANY),
    ("mrope_position_deltas", "INT64", ONE),
    ("lora_task_id", "UINT64", ONE),
    ("lora_weights", "FP16", (-1, -1)),
    ("lora_config", "INT32", (-1, 3)),
    ("context_phase_params", "UINT8", ANY),
    ("skip_cross_attn_blocks", "BOOL", ONE),
    ("retention_token_range_starts", "INT32", ANY),
    ("retention_token_range_ends", "INT32", ANY),
    ("retention_token_range_priorities", "INT32", ANY),
    ("retention_token_range_durations_ms", "INT32", ANY),
    ("retention_decode_priority", "INT32", ONE),
    ("retention_decode_duration_ms", "INT32", ONE),
    ("guided_decoding_guide_type", "BYTES", ONE),
    ("guided_decoding_guide", "BYTES", ONE),
    ("lookahead_window_size", "INT32", ONE),
    ("lookahead_ngram_size", "INT32", ONE),
    ("lookahead_verification_set_size", "INT32", ONE),
)
CORE_MODEL_OUTPUTS = {
    **_tensors(("output_ids", "INT32", (-1, -1)),  # [beam, tokens]: one beam here
               ("sequence_length", "INT32", ANY),  # per beam: the tokens in output_ids
               ("cum_log_probs", "FP32", ANY),
               ("output_log_probs", "FP32", (-1, -1))),
    **{name: CLIENT_OUTPUTS[name] for name in (
        "context_logits", "generation_logits", "batch_index", "sequence_index", "kv_cache_alloc_new_blocks",
        "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns", "first_scheduled_time_ns",
        "first_token_time_ns", "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens",
        "total_draft_tokens",
        # ours, as the fronts answer them
        "output_models", "finish_reason", "large_model_share")},
}

# --- the standalone text models, TensorRT-LLM's ``preprocessing`` and ``postprocessing`` ----------
# (c2e65b88's names, dtypes and dims; text/preprocessing_model.py, text/postprocessing_model.py)
PREPROCESSING_INPUTS = _tensors(
    ("QUERY", "BYTES", ONE),
    ("REQUEST_OUTPUT_LEN", "INT32", ONE),
    ("BAD_WORDS_DICT", "BYTES", ANY),
    ("STOP_WORDS_DICT", "BYTES", ANY),
    ("EMBEDDING_BIAS_WORDS", "BYTES", ANY),
    ("EMBEDDING_BIAS_WEIGHTS", "FP32", ANY),
    ("END_ID", "INT32", ONE),
    ("PAD_ID", "INT32", ONE),
    ("DECODER_QUERY", "BYTES", ONE),
    ("IMAGE_BYTES", "UINT8", (-1, -1, -1, -1)),
    ("IMAGE_URL", "BYTES", ONE),
    ("VIDEO_BYTES", "UINT8", (-1, -1, -1, -1)),
    ("PROMPT_TABLE_EXTRA_ID", "UINT64", ONE),
)
PREPROCESSING_OUTPUTS = _tensors(
    ("INPUT_ID", "INT32", ANY),
    ("REQUEST_INPUT_LEN", "INT32", ONE),
    ("DECODER_INPUT_ID", "INT32", ANY),
    ("REQUEST_DECODER_INPUT_LEN", "INT32", ONE),
    ("BAD_WORDS_IDS", "INT32", (2, -1)),
    ("STOP_WORDS_IDS", "INT32", (2, -1)),
    ("EMBEDDING_BIAS", "FP32", ANY),
    ("REQUEST_OUTPUT_LEN", "INT32", ANY),
    ("OUT_END_ID", "INT32", ONE),
    ("OUT_PAD_ID", "INT32", ONE),
)
POSTPROCESSING_INPUTS = _tensors(("TOKENS_BATCH", "INT32", (-1, -1)), ("SEQUENCE_LENGTH", "INT32", ANY))
POSTPROCESSING_OUTPUTS = _tensors(("OUTPUT", "BYTES", ANY))

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


def word_list_rows(rows: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """Token sequences per batch row in TensorRT-LLM's word-list layout, ``[rows, 2, n]``: row ``[0]``
    the sequences' ids back to back, row ``[1]`` the cumulative end offset of each, both padded to
    the longest row (ids with 0, offsets with -1), at least 1 wide."""
    flat = [[token for sequence in sequences for token in sequence] for sequences in rows]
    ends = [np.cumsum([len(sequence) for sequence in sequences]).tolist() for sequences in rows]
    width = max([1, *(len(ids) for ids in flat)])
    array = np.zeros((len(rows), 2, width), dtype=np.int32)
    array[:, 1, :] = -1
    for r, (ids, offsets) in enumerate(zip(flat, ends)):
        array[r, 0, :len(ids)] = ids
        array[r, 1, :len(offsets)] = offsets
    return array


def word_list_sequences(row: np.ndarray) -> list[list[int]]:
    """One batch row ``[2, n]`` of TensorRT-LLM's word-list layout as token sequences (empty ones dropped);
    offsets end at the first negative one. Raises ValueError for offsets that go back or past the ids."""
    ids, offsets = row[0].tolist(), row[1].tolist()
    sequences, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end < start or end > len(ids):
            raise ValueError(f"offset {end} goes back or past the {len(ids)} ids")
        if end > start:
            sequences.append(ids[start:end])
        start = end
    return sequences
