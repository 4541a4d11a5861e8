"""The device check's torch-engine parts: exact checks on the tiny pair, speed on real shapes."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
from transformers import GenerationConfig

from tokenrouter.engine.base import StepRow
from tokenrouter.engine.loader import transformers_attention
from tokenrouter.engine.torch_engine import TorchEngine

from tokenrouter_tools.gpu_check_common import (
    BLOCK_SIZE,
    Budget,
    Plan,
    free_memory,
    load_model,
    mixed_prompts,
    prompt,
    random_model,
    run_part,
    synchronize,
)


# --- exact: greedy == transformers generate, a resume feeds only its new tokens ---------------------
def generate_greedy(model: Any, context: Sequence[int], steps: int) -> list[int]:
    """transformers ``generate`` from scratch on the same weights, greedy, no end id."""
    config = GenerationConfig(max_new_tokens=steps, do_sample=False, eos_token_id=[], pad_token_id=0)
    device = next(model.parameters()).device
    with transformers_attention(model), torch.inference_mode():
        out = model.generate(torch.tensor([list(context)], device=device),
                             attention_mask=torch.ones(1, len(context), dtype=torch.long, device=device),
                             generation_config=config)
    return out[0, len(context):].tolist()


def step_greedy(engine: Any, prompts: Sequence[Sequence[int]], steps: int) -> list[list[int]]:
    """All prompts prefilled in one step, then ``steps - 1`` decode steps over the whole batch."""
    ids = [f"g{i}" for i in range(len(prompts))]
    for seq_id in ids:
        engine.add_sequence(seq_id)
    outputs: list[list[int]] = [[] for _ in prompts]
    feeds = [list(p) for p in prompts]
    try:
        for _ in range(steps):
            result = engine.step([StepRow(seq_id, feed) for seq_id, feed in zip(ids, feeds)])
            for row, token in enumerate(result.sampled.tolist()):
                outputs[row].append(token)
                feeds[row] = [token]
    finally:
        for seq_id in ids:
            engine.release(seq_id)
    return outputs


def greedy_equals_generate(engine: Any, model: Any, prompts: Sequence[Sequence[int]], steps: int) -> dict[str, Any]:
    """A batch of mixed-length prompts stepped together equals ``generate`` run on each alone."""
    ours = step_greedy(engine, prompts, steps)
    rows = [ours_row == generate_greedy(model, p, steps) for p, ours_row in zip(prompts, ours)]
    return {"passed": all(rows), "rows_equal": f"{sum(rows)}/{len(rows)}", "steps": steps}


def resume_computes_only_new_tokens(engine: TorchEngine, model: Any, vocab: int) -> dict[str, Any]:
    """A sequence left out of steps keeps its blocks; resuming it with k tokens (its own last one
    and two foreign) feeds the model exactly those k, and its next token is generate's on the
    whole context. Counted at the model's input embeddings: what the engine really computed."""
    fed: list[int] = []
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda module, args: fed.append(args[0].numel()))
    away, busy = prompt(80, vocab, seed=21), prompt(30, vocab, seed=22)
    engine.add_sequence("away")
    engine.add_sequence("busy")
    try:
        first = engine.step([StepRow("away", away), StepRow("busy", busy)]).sampled.tolist()
        blocks = engine.block_table("away")
        last = first[1]
        for _ in range(3):  # "away" is pending at a peer meanwhile
            last = int(engine.step([StepRow("busy", [last])]).sampled[0])
        kept = engine.block_table("away") == blocks
        foreign = prompt(2, vocab, seed=23)
        resume = [first[0], *foreign]
        fed.clear()
        result = engine.step([StepRow("away", resume), StepRow("busy", [last])])
        next_token = int(result.sampled[0])
    finally:
        hook.remove()
        engine.release("away")
        engine.release("busy")
    expected = generate_greedy(model, away + resume, 1)[0]
    return {"passed": kept and fed == [len(resume) + 1] and next_token == expected,
            "blocks_kept_while_pending": kept, "tokens_fed_on_resume_step": sum(fed),
            "expected_fed": len(resume) + 1, "token_after_resume_equals_generate": next_token == expected}


def exact_torch_checks(pair: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """On the tiny pair in float32, on the device: greedy == generate for both models, then the resume."""
    report: dict[str, Any] = {}
    for size, path in pair.items():
        model = load_model(path, plan.device)
        engine = TorchEngine(size, model, num_blocks=4096 // BLOCK_SIZE, block_size=BLOCK_SIZE)
        prompts = mixed_prompts(4, model.config.vocab_size, seed=11)
        report[f"greedy_equals_generate_{size}"] = greedy_equals_generate(engine, model, prompts, plan.exact_tokens)
        if size == "large":
            report["resume_computes_only_new_tokens"] = resume_computes_only_new_tokens(
                engine, model, model.config.vocab_size)
        engine.close()
    return report


# --- speed on real shapes ---------------------------------------------------------------------------
def greedy_vs_generate(engine: TorchEngine, model: Any, plan: Plan) -> dict[str, Any]:
    """Engine greedy tokens vs transformers ``generate`` on the same random weights, in the speed dtype:
    informative only (random weights have near ties that bfloat16 rounding can flip)."""
    context = prompt(plan.greedy_prompt, model.config.vocab_size, seed=1)
    engine.add_sequence("greedy")
    tokens, first_logits, feed = [], None, context
    for _ in range(plan.greedy_steps):
        result = engine.step([StepRow("greedy", feed)])
        first_logits = result.require_logits()[0] if first_logits is None else first_logits
        feed = [int(result.sampled[0])]
        tokens.append(feed[0])
    engine.release("greedy")
    config = GenerationConfig(max_new_tokens=plan.greedy_steps, do_sample=False, eos_token_id=[], pad_token_id=0,
                              output_logits=True, return_dict_in_generate=True)
    with transformers_attention(model), torch.no_grad():
        out = model.generate(torch.tensor([context], device=plan.device),
                             attention_mask=torch.ones(1, len(context), dtype=torch.long, device=plan.device),
                             generation_config=config)
    expected = out.sequences[0, len(context):].tolist()
    agree = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), len(tokens))
    return {"tokens_equal": tokens == expected, "agreeing_prefix": agree, "steps": plan.greedy_steps,
            "first_step_max_abs_logit_diff": float((first_logits - out.logits[0][0].float().cpu()).abs().max())}


def prefill(engine: TorchEngine, ids: list[str], context: int, vocab: int) -> None:
    for index, seq_id in enumerate(ids):
        engine.add_sequence(seq_id)
        engine.step([StepRow(seq_id, prompt(context, vocab, seed=100 + index))])


def timed_decode(engine: TorchEngine, ids: list[str], plan: Plan, last: dict[str, int]) -> float:
    """Median ms per decode step over ``ids`` (two warm-up steps first)."""
    times = []
    for step in range(plan.timed_steps + 2):
        synchronize(plan.device)
        start = time.perf_counter()
        result = engine.step([StepRow(seq_id, [last[seq_id]]) for seq_id in ids])
        synchronize(plan.device)
        if step >= 2:
            times.append((time.perf_counter() - start) * 1e3)
        last.update(zip(ids, result.sampled.tolist()))
    return round(statistics.median(times), 3)


def decode_speed(engine: TorchEngine, plan: Plan, vocab: int, budget: Budget) -> dict[str, Any]:
    """ms/step for each batch size at each context: the largest batch is prefilled once per context."""
    speeds: dict[str, Any] = {}
    for context in plan.contexts:
        ids = [f"c{context}-{i}" for i in range(max(plan.batches))]
        if budget.left() <= 0:
            speeds[f"context_{context}"] = {"skipped": "time budget spent"}
            continue
        prefill(engine, ids, context, vocab)
        last = {seq_id: 0 for seq_id in ids}
        speeds[f"context_{context}"] = {f"batch_{b}_ms_per_step": timed_decode(engine, ids[:b], plan, last)
                                        for b in plan.batches}
        for seq_id in ids:
            engine.release(seq_id)
    return speeds


def mixed_step(engine: TorchEngine, plan: Plan, vocab: int) -> dict[str, Any]:
    """One long prefill next to max_batch - 1 decodes at the longest context: must not run out of memory."""
    decodes = [f"m{i}" for i in range(max(plan.batches) - 1)]
    prefill(engine, decodes, max(plan.contexts), vocab)
    engine.add_sequence("long")
    rows = [StepRow("long", prompt(plan.mixed_prefill, vocab, seed=7))] + [StepRow(s, [1]) for s in decodes]
    if plan.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    synchronize(plan.device)
    start = time.perf_counter()
    engine.step(rows)
    synchronize(plan.device)
    report = {"prefill_tokens": plan.mixed_prefill, "decode_rows": len(decodes),
              "ms": round((time.perf_counter() - start) * 1e3, 3)}
    if plan.device.startswith("cuda"):
        report["peak_extra_gib"] = round((torch.cuda.max_memory_allocated() - before) / 2**30, 3)
    for seq_id in decodes + ["long"]:
        engine.release(seq_id)
    return report


def sdpa_backends(engine: TorchEngine, plan: Plan, vocab: int) -> dict[str, Any]:
    """Which SDPA kernel our masked, batched attention dispatches to, and which backends accept it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    engine.add_sequence("sdpa")
    engine.step([StepRow("sdpa", prompt(32, vocab, seed=3))])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        engine.step([StepRow("sdpa", [1])])
    dispatched = sorted({event.key for event in profile.key_averages() if "scaled_dot_product" in event.key
                         and event.key != "aten::scaled_dot_product_attention"})
    accepted: dict[str, Any] = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                engine.step([StepRow("sdpa", [1])])
            accepted[backend.name] = True
        except RuntimeError as error:
            accepted[backend.name] = f"refused: {str(error).splitlines()[0][:160]}"
    engine.release("sdpa")
    return {"dispatched_ops": dispatched, "forced_backend_runs": accepted}


def check_shape(shape: str, plan: Plan, budget: Budget) -> dict[str, Any]:
    """The torch engine on one real shape with random weights, in the plan's dtype."""
    report = _measure_shape(shape, plan, budget)
    free_memory()  # the model and its engine lived only in _measure_shape's frame (its lambdas too)
    return report


def _measure_shape(shape: str, plan: Plan, budget: Budget) -> dict[str, Any]:
    model = random_model(shape, plan.device, plan.dtype)
    capacity = max(plan.batches) * (max(plan.contexts) + 64) + plan.mixed_prefill + 1024
    engine = TorchEngine(shape, model, num_blocks=capacity // BLOCK_SIZE, block_size=BLOCK_SIZE)
    vocab = model.config.vocab_size
    report: dict[str, Any] = {"parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
                              "kv_pool_tokens": capacity}
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("greedy_vs_generate", lambda: greedy_vs_generate(engine, model, plan)),
        ("sdpa", lambda: sdpa_backends(engine, plan, vocab)),
        ("mixed_prefill_decode_step", lambda: mixed_step(engine, plan, vocab)),
        ("decode", lambda: decode_speed(engine, plan, vocab, budget)),
    ]
    for name, part in parts:
        report[name] = run_part(part, budget)
    engine.close()
    return report
