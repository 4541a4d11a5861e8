"""What crosses the sockets between a Dynamo worker (pair_process.py) and its pair's process
(pair_host.py): one frozen dataclass per message, pickled whole in a frame (frames.py).

Requests socket: the worker sends ``Submit``, ``Cancel`` and ``Close``; the pair answers ``Ready`` or
``Failed`` once, then ``Out`` messages. Control socket: ``AskStats``, answered with ``Stats`` (or
``ControlError``). An ``Out`` carries every step's tokens, so its rows stay plain tuples (``Output``,
``Refusal``): a dataclass per row would cost a constructor call per row to unpickle, where the
message's own class costs one, and nothing is copied into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# One request's output since the last Out: (key, tokens, their models' indices, logprobs or None,
# finish_reason or None, error or None), what RequestHandle.since returns, behind the key.
Output = tuple[int, list[int], list[int], list[float] | None, str | None, str | None]
Refusal = tuple[int, str, str]  # (key, kind: "invalid" | "busy" | "error", message)


# --- worker -> pair (requests socket) ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Submit:
    """Start request ``key``: ``TokenRouter.submit(prompt, **keywords)``."""

    key: int
    prompt: list[int]
    keywords: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Cancel:
    key: int


@dataclass(frozen=True, slots=True)
class Close:
    """Stop the pair (its loops end their requests) and end the process."""


ToPair = Submit | Cancel | Close


# --- pair -> worker (requests socket) ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ready:
    """Every model is loaded (the first message, unless ``Failed``)."""

    max_model_len: int
    block_size: int
    num_total_blocks: int


@dataclass(frozen=True, slots=True)
class Failed:  # the pair did not start (the only message; the process ends)
    reason: str


@dataclass(frozen=True, slots=True)
class Out:
    """What the loops committed since the last ``Out``: the requests' new output, and the submits refused."""

    outputs: list[Output]
    refused: list[Refusal]


FromPair = Ready | Failed | Out


# --- control socket ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AskStats:
    pass


@dataclass(frozen=True, slots=True)
class Stats:
    kv_blocks_used: dict[str, int]
    held_requests: dict[str, int]
    alive: bool


@dataclass(frozen=True, slots=True)
class ControlError:
    """The question could not be answered (what it was, why)."""

    reason: str


ControlAnswer = Stats | ControlError
