"""The per-row signals of a vLLM step, captured on the rank that has them.

vLLM mixes this class into its worker class on every rank (``EngineArgs.worker_extension_cls``,
vLLM's supported hook; the module is imported by qualified name in every worker process, so it
imports nothing of vLLM at module level). The engine calls its methods through the executor's
``collective_rpc``: in this process with one rank (the uniprocess executor), in the worker
processes with tensor parallelism (the multiprocess executor), one mechanism for both.

``tokenrouter_install_capture`` wraps the model's ``compute_logits`` on every rank. Its input is
the final-norm hidden states of the positions being sampled, its output the full-vocabulary logits,
rows in the model runner's batch order (``input_batch.req_ids``). With TP > 1 vLLM gathers the
logits to rank 0 (or to every rank): rank 0 keeps a copy of the last step's rows, and
``tokenrouter_fetch`` hands back only the rows asked for, in the order asked, and of them only what
the step asks for: each row's argmax always, the full-vocabulary logits, the top-k and the hidden
states when asked. Without the full rows a step's reply is a few bytes per row instead of
vocabulary x 4 (600 KB a row at a 151k vocabulary), which crosses processes with TP > 1.
A capture is handed out once: a step that ran no forward cannot return the previous step's rows.
"""

from __future__ import annotations

from typing import Any

WORKER_EXTENSION = f"{__name__}.CaptureExtension"


class StepCapture:
    """What rank 0 kept of the last ``compute_logits``: request ids in batch order and the tensors."""

    def __init__(self, request_ids: list[str], logits: Any, hidden_states: Any) -> None:
        self.request_ids, self.logits, self.hidden_states = request_ids, logits, hidden_states

    def rows(self, request_ids: list[str], *, full: bool, top_k: int, hidden: bool, to_cpu: bool) -> dict[str, Any]:
        """Of ``request_ids``' rows, in that order: "logits" [B, V] when ``full``, else "argmax" [B] of
        the raw logits (the engine samples from the full rows itself); "topk_values", "topk_indices"
        [B, k] (of the float32 logits) when ``top_k``; "hidden" [B, H] when ``hidden``. Absent signals
        are None."""
        import torch

        order = {request_id: i for i, request_id in enumerate(self.request_ids)}
        missing = [request_id for request_id in request_ids if request_id not in order]
        if missing:
            raise RuntimeError(f"vLLM did not run request(s) {missing} in the step")
        index = torch.tensor([order[request_id] for request_id in request_ids], device=self.logits.device)
        logits = self.logits.index_select(0, index)
        signals = {"argmax": None if full else logits.argmax(dim=-1), "logits": logits if full else None,
                   "topk_values": None, "topk_indices": None,
                   "hidden": self.hidden_states.index_select(0, index) if hidden else None}
        if top_k:
            top = torch.topk(logits.float(), top_k, dim=-1)
            signals["topk_values"], signals["topk_indices"] = top.values, top.indices
        if to_cpu:  # crossing processes: a device tensor would not travel
            signals = {key: None if value is None else value.cpu() for key, value in signals.items()}
        return signals


class CaptureExtension:
    """Methods vLLM adds to its worker on every rank (names prefixed: they must not clash with vLLM's)."""

    def tokenrouter_install_capture(self) -> None:
        """Wrap the model's compute_logits; only rank 0 keeps what it returns."""
        runner = self.model_runner  # type: ignore[attr-defined]
        model = runner.get_model()
        compute_logits = model.compute_logits
        keeps = self.rank == 0  # type: ignore[attr-defined]
        self.tokenrouter_capture = None

        def capturing_compute_logits(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            logits = compute_logits(hidden_states, *args, **kwargs)
            if keeps and logits is not None:
                # vLLM's sampler may work on these tensors in place: keep our own copies.
                self.tokenrouter_capture = StepCapture(list(runner.input_batch.req_ids)[:logits.shape[0]],
                                                       logits.detach().clone(), hidden_states.detach().clone())
            return logits

        model.compute_logits = capturing_compute_logits

    def tokenrouter_fetch(self, request_ids: list[str], full: bool, top_k: int, hidden: bool,
                          to_cpu: bool) -> dict[str, Any] | None:
        """Rank 0: the last step's signals of ``request_ids`` (``StepCapture.rows``); None on other
        ranks, or when no forward ran since the last fetch."""
        capture, self.tokenrouter_capture = getattr(self, "tokenrouter_capture", None), None
        if self.rank != 0 or capture is None:  # type: ignore[attr-defined]
            return None
        return capture.rows(request_ids, full=full, top_k=top_k, hidden=hidden, to_cpu=to_cpu)

    def tokenrouter_runner_facts(self) -> dict[str, Any]:
        """What the engine checks after start (vllm_compat.check_started_engine): the runner vLLM picked."""
        runner = self.model_runner  # type: ignore[attr-defined]
        return {"runner": type(runner).__name__, "input_batch": hasattr(runner, "input_batch")}
