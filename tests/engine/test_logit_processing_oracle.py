"""Oracle: an engine's greedy tokens under TensorRT-LLM's logit processing equal transformers
``generate`` with the same processing on the same weights, for the torch engine and the vLLM engine
(which runs in a child process: the engine process path).

transformers applies ``sequence_bias`` (one-token sequences: our logit bias), then
``repetition_penalty`` (over every token of its input, prompt included), then ``min_new_tokens``,
the order TensorRT-LLM's penalty kernel uses. Each request is stepped in one batch with rows that
ask for no processing, and one request takes an extend of foreign tokens midway (what another model
of the route produced): its penalties must count those, and its min_tokens keep counting output.
Presence and frequency penalties have no transformers counterpart; the routed oracle
(tests/runtime/test_oracle_sampling.py) checks them against the naive reference.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList, MinNewTokensLengthLogitsProcessor

from tokenrouter.engine.base import SamplingParams, StepRow

STEPS = 10


@pytest.fixture(params=["torch", "vllm"])
def engine(request, tiny_pair, make_engine):
    if request.param == "torch":
        yield make_engine(tiny_pair["small"])
        return
    engine = request.getfixturevalue("vllm_tiny_engines")["small"]
    yield engine
    for seq_id in engine.sequence_ids():
        engine.release(seq_id)


def decode(engine, prompts: dict[str, list[int]], sampling: dict[str, SamplingParams], *,
           extend: tuple[str, int, list[int]] | None = None) -> dict[str, list[list[int]]]:
    """Greedy steps of all prompts in one batch. ``extend`` = (seq, step, tokens): at that step the
    sequence is fed those foreign tokens instead of its sampled token. Returns each sequence's output
    segments (a new segment starts after the extend)."""
    for seq_id in prompts:
        engine.add_sequence(seq_id)
    segments = {seq_id: [[]] for seq_id in prompts}
    feed = dict(prompts)
    for step in range(STEPS):
        out = engine.step([StepRow(seq_id, feed[seq_id], sampling[seq_id]) for seq_id in prompts])
        for seq_id, token in zip(prompts, out.sampled.tolist()):
            if extend is not None and extend[:2] == (seq_id, step):
                feed[seq_id] = extend[2]
                segments[seq_id].append([])
            else:
                feed[seq_id] = [token]
                segments[seq_id][-1].append(token)
    for seq_id in prompts:
        engine.release(seq_id)
    return segments


def hf_greedy(model, context: list[int], steps: int, params: SamplingParams, generated: int) -> list[int]:
    """transformers ``generate`` from ``context``, which already holds ``generated`` output tokens."""
    config = GenerationConfig(max_new_tokens=steps, do_sample=False, eos_token_id=[], pad_token_id=0,
                              repetition_penalty=params.repetition_penalty,
                              sequence_bias={(token,): weight for token, weight in params.logit_bias} or None)
    processors = LogitsProcessorList()
    if params.min_tokens > generated:
        # Not through the config: its eos ids would also stop generation, and the engine never stops.
        processors.append(MinNewTokensLengthLogitsProcessor(len(context), params.min_tokens - generated,
                                                            list(params.end_ids)))
    out = model.generate(torch.tensor([context]), attention_mask=torch.ones(1, len(context), dtype=torch.long),
                         generation_config=config, logits_processor=processors)
    return out[0, len(context):].tolist()


def test_processed_greedy_equals_generate(engine, tiny_pair, hf_model):
    model = hf_model(tiny_pair["small"])
    prompts = {"bias": [11, 12, 13, 14, 15, 16], "plain": [20, 21, 22, 23], "repeat": [30, 31, 32],
               "min": [40, 41, 42]}
    plain = {seq_id: SamplingParams() for seq_id in prompts}
    free = decode(engine, prompts, plain)
    # Processing chosen so that it changes each greedy output: end ids the model picks unprocessed,
    # a bias towards a token it never picks, a penalty that favours the tokens it counts.
    prompts["repeat"] = prompts["repeat"] + free["repeat"][0][:4]
    foreign = free["repeat"][0][4:8]
    bias_token = next(t for t in range(100, engine.vocab_size) if t not in free["bias"][0])
    sampling = {
        "bias": SamplingParams(logit_bias=((bias_token, 4.0), (free["bias"][0][0], -2.0))),
        "plain": SamplingParams(),
        # Below 1 the penalty draws the output to the counted tokens: which ones count decides it.
        "repeat": SamplingParams(repetition_penalty=0.2, logit_bias=((free["repeat"][0][0], 0.5),)),
        "min": SamplingParams(min_tokens=6, prompt_len=len(prompts["min"]), end_ids=tuple(free["min"][0][:3]),
                              repetition_penalty=1.3),
    }
    processed = decode(engine, prompts, sampling, extend=("repeat", 4, foreign))
    assert processed["plain"] == free["plain"], "a row without processing changed"
    for seq_id in ("bias", "repeat", "min"):
        assert processed[seq_id] != free[seq_id], f"{seq_id}: the processing changed nothing, so it tests nothing"
    assert set(processed["min"][0][:6]).isdisjoint(sampling["min"].end_ids)

    for seq_id, segments in processed.items():
        context, generated = list(prompts[seq_id]), 0
        for index, segment in enumerate(segments):
            expected = hf_greedy(model, context, len(segment), sampling[seq_id], generated)
            assert segment == expected, f"{engine.name} {seq_id} segment {index}"
            context += segment + (foreign if index < len(segments) - 1 else [])
            generated += len(segment) + len(foreign)
