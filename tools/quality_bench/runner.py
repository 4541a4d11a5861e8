"""Run one policy setting over the problems on engines loaded once, and judge its completions.

All problems of a setting are submitted at once (the config's ``max_active`` bounds concurrency),
so every setting sees the same load; throughput is the output tokens of the whole run divided by
its wall time, from the first submit to the last finish.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from tokenrouter import TokenRouter
from tokenrouter.config import TokenRouterConfig, load_config
from tokenrouter.engine.base import Engine
from tokenrouter.engine.factory import create_engine
from tokenrouter.runtime.api import RequestHandle

from .humaneval import Mode, completion_from_output, judge, prompt_text, stop_words, uses_chat_template
from .settings import PolicySetting

POLL_S = 0.5


@dataclass
class ProblemRecord:
    task_id: str
    passed: bool
    status: str  # the sandbox's: passed, failed, timeout; or error (generation failed)
    detail: str
    finish_reason: str
    output_tokens: int
    large_tokens: int
    completion: str  # what was judged (after the prompt)
    text: str  # the raw generated text


@dataclass
class PolicyRun:
    label: str
    policy: str
    params: dict[str, Any]
    wall_s: float
    records: list[ProblemRecord] = field(default_factory=list)
    finished_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.records)

    @property
    def large_share(self) -> float:
        """Share of all output tokens written by the large model (token-weighted over problems)."""
        return sum(r.large_tokens for r in self.records) / max(1, self.output_tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PolicyRun":
        records = [ProblemRecord(**r) for r in data["records"]]
        return cls(data["label"], data["policy"], data["params"], data["wall_s"], records, data["finished_at"])


def load_engines(config: TokenRouterConfig) -> dict[str, Engine]:
    """The config's models, loaded once and shared by every setting's TokenRouter."""
    return {name: create_engine(name, config.models[name]) for name in config.model_names}


def warm_up(base: TokenRouterConfig, engines: dict[str, Engine]) -> None:
    """A few tokens on both models before anything is timed (first-step allocations, lazy init)."""
    config = load_config({**base.model_dump(), "policy": {"name": "llm_only"}})
    with TokenRouter(config, engines=engines) as engine:
        engine.generate("def add(a, b):", max_tokens=4)


def run_setting(base: TokenRouterConfig, engines: dict[str, Engine], problems: Sequence[dict[str, Any]],
                setting: PolicySetting, *, mode: Mode, max_tokens: int, routers: Path,
                judge_timeout_s: float = 10.0, progress: bool = True) -> PolicyRun:
    config = setting.config(base, chat_template=uses_chat_template(mode), routers=routers)
    with TokenRouter(config, engines=engines) as engine:
        prompts = [prompt_text(p, mode, engine.codec.tokenizer) for p in problems]
        started = time.perf_counter()
        handles = [engine.submit(prompt, max_tokens=max_tokens, temperature=0.0, seed=0,
                                 stop=stop_words(mode)) for prompt in prompts]
        wall_s = _wait(handles, setting.label, progress) - started
        results = [h.wait() for h in handles]
    run = PolicyRun(setting.label, setting.name, setting.params, wall_s)
    for problem, result in zip(problems, results):
        large = sum(1 for m in result.models if m != config.entry)
        if result.finish_reason == "error":
            run.records.append(ProblemRecord(problem["task_id"], False, "error", result.error or "", "error",
                                             len(result.token_ids), large, "", ""))
            continue
        completion = completion_from_output(problem, result.text or "", mode)
        verdict = judge(problem, completion, timeout_s=judge_timeout_s)
        run.records.append(ProblemRecord(problem["task_id"], verdict.passed, verdict.status, verdict.detail,
                                         result.finish_reason, len(result.token_ids), large, completion,
                                         result.text or ""))
    return run


def _wait(handles: Sequence[RequestHandle], label: str, progress: bool) -> float:
    """Wait for every request, with a bar over finished problems and the token rate so far; returns
    the time of the last finish (perf_counter), recorded by the request's own listener."""
    last_finish = [time.perf_counter()]
    finished = threading.Event()

    def on_output(handle: RequestHandle) -> None:
        if handle.done:
            last_finish[0] = time.perf_counter()
            if all(h.done for h in handles):
                finished.set()

    for handle in handles:
        handle.add_listener(lambda handle=handle: on_output(handle))
        on_output(handle)  # it may have finished before the listener was added
    started = time.perf_counter()
    with tqdm(total=len(handles), desc=label, unit="problem", disable=not progress) as bar:
        while True:
            done = finished.wait(POLL_S)
            tokens = sum(len(h.token_ids) for h in handles)
            bar.update(sum(h.done for h in handles) - bar.n)
            bar.set_postfix(tokens=tokens, tok_s=f"{tokens / max(1e-9, time.perf_counter() - started):.1f}")
            if done:
                return last_finish[0]
