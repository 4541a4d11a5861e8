"""What the runtime pays beyond a decode row: prefills on first visits and extends on resume.

A decode row feeds one token (the one its model sampled last step). A row that arrives feeds more:
the entry model prefills a new request's prompt; a peer, on a request's first visit, prefills the
whole context (prompt and every token committed so far); on a later visit, and the entry on a
request's return, it extends by the k tokens committed since it last ran. A step then costs its
decode latency at its batch size plus, per row, ``per_token_s`` for every fed token past the first
and ``arrival_s`` if the row arrived (a request's first row on that model, or its first after a
visit elsewhere). That is the simulated engine's profile exactly (``per_token_ms``; arrival 0) and
the shape the step-cost measurement of a real engine fits.

Which rows arrive and how much they feed depends on each request's history, which the chain's
state does not hold. The chain is charged the expectation per row instead (``per_row_charge``),
computed exactly for the per-request routing process: a request starts at the entry with a prompt,
every row at model i moves to j with ``P[i][j]`` and commits ``C[i][j]`` tokens, and the request
ends once it has committed ``output_tokens`` (its successor starts at the entry). Over a request,
model i is fed exactly the context as it stood at i's last row, so its extra tokens are that
length minus its rows. ``montecarlo.simulate(prefill=...)`` follows each request's tokens instead
and charges every row what it feeds: agreement checks the expectation.

Not modelled: chunked prefill (a prompt longer than the step's prefill budget spreads over steps;
the charge is the same tokens in one row), and the change of routing that a successor starting at
the entry makes where a finishing row would have stayed elsewhere (the chain keeps P; for policies
whose large model hands back, every bench policy, the successor starts where the row went anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np


@dataclass(frozen=True)
class PrefillCosts:
    """Per-row charges and the requests that cause them."""

    per_token_s: tuple[float, ...]  # per model: seconds per fed token past a row's first
    prompt_tokens: tuple[int, int]  # a new request's prompt length, uniform in [lo, hi]
    output_tokens: int  # committed tokens per request; then a new request starts at the entry
    arrival_s: tuple[float, ...] | None = None  # per model: seconds per arriving row (default 0)

    def __post_init__(self) -> None:
        per_token = tuple(float(x) for x in self.per_token_s)
        arrival = tuple(float(x) for x in self.arrival_s) if self.arrival_s is not None else (0.0,) * len(per_token)
        if len(arrival) != len(per_token):
            raise ValueError(f"arrival_s needs one value per model ({len(per_token)}), got {len(arrival)}")
        if not all(np.isfinite(x) and x >= 0 for x in per_token + arrival):
            raise ValueError(f"per_token_s and arrival_s must be finite and >= 0 seconds, got {per_token}, {arrival}")
        lo, hi = self.prompt_tokens
        if not (isinstance(lo, (int, np.integer)) and isinstance(hi, (int, np.integer)) and 1 <= lo <= hi):
            raise ValueError(f"prompt_tokens must be whole numbers 1 <= lo <= hi, got {self.prompt_tokens}")
        if isinstance(self.output_tokens, bool) or not isinstance(self.output_tokens, (int, np.integer)) \
                or self.output_tokens < 1:
            raise ValueError(f"output_tokens must be an integer >= 1, got {self.output_tokens!r}")
        object.__setattr__(self, "per_token_s", per_token)
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "prompt_tokens", (int(lo), int(hi)))
        object.__setattr__(self, "output_tokens", int(self.output_tokens))

    @property
    def arrival(self) -> tuple[float, ...]:
        """Seconds per arriving row, per model (zeros when not given)."""
        return self.arrival_s if self.arrival_s is not None else (0.0,) * len(self.per_token_s)

    @property
    def mean_prompt(self) -> float:
        return (self.prompt_tokens[0] + self.prompt_tokens[1]) / 2


@dataclass(frozen=True)
class RequestLoad:
    """Expectations over one request's life, per model."""

    rows: np.ndarray  # rows (engine-step entries) the request runs on each model
    arrivals: np.ndarray  # of those, rows that arrived (first on the model, or back from elsewhere)
    fed: np.ndarray  # tokens fed to each model: prompt + committed tokens before its last row


def check_costs(prefill: PrefillCosts, P: np.ndarray, C: np.ndarray) -> None:
    M = len(P)
    if len(prefill.per_token_s) != M:
        raise ValueError(f"per_token_s needs one value per model ({M}), got {len(prefill.per_token_s)}")
    used = P > 0
    if (np.abs(C[used] - np.rint(C[used])) > 1e-9).any():
        raise ValueError(f"prefill charges follow each request's tokens: C must be whole tokens, got {C.tolist()}")
    if any(P[i, i] > 0 and C[i, i] < 1 for i in range(M)):
        raise ValueError("prefill charges: a row that stays on its model must commit its token (C[i][i] >= 1)")


def request_load(P: np.ndarray, C: np.ndarray, prefill: PrefillCosts) -> RequestLoad:
    """Rows, arrivals and fed tokens per model over one request, by dynamic programming over
    (model, tokens committed so far). Transitions that commit nothing stay on the same level and
    are solved as a linear system per level."""
    check_costs(prefill, P, C)
    M, T = len(P), prefill.output_tokens
    commit = np.rint(C).astype(int)
    zero = np.where(commit == 0, P, 0.0)  # moves within a level
    within = np.linalg.inv(np.eye(M) - zero.T)  # rows at a level = within @ (rows entering it)
    # occupancy[t, i]: expected rows at model i that start with t tokens committed
    occupancy = np.zeros((T, M))
    entering = np.zeros((T, M))  # rows entering level t from a lower level (or the start)
    arriving = np.zeros((T, M))  # of the rows at (t, i), those whose previous row was elsewhere
    entering[0, 0] = 1.0
    arriving[0, 0] = 1.0
    for t in range(T):
        occupancy[t] = within @ entering[t]
        moved = occupancy[t][:, None] * P  # expected moves i -> j from level t
        arriving[t] += (moved * (commit == 0) * (1 - np.eye(M))).sum(axis=0)
        for i in range(M):
            for j in range(M):
                step = commit[i, j]
                if P[i, j] > 0 and step > 0 and t + step < T:
                    entering[t + step, j] += moved[i, j]
                    if i != j:
                        arriving[t + step, j] += moved[i, j]
    fed = np.zeros(M)
    for j in range(M):
        last = _last_row_probability(P, commit, j, T)  # last[t]: a row at (t, j) is j's last
        fed[j] = float(occupancy[:, j] @ ((prefill.mean_prompt + np.arange(T)) * last))
    return RequestLoad(occupancy.sum(axis=0), arriving.sum(axis=0), fed)


def _last_row_probability(P: np.ndarray, commit: np.ndarray, j: int, T: int) -> np.ndarray:
    """For each level t: the probability that a row of model j there is the request's last on j."""
    M = len(P)
    # never[t, i]: starting a row at model i with t committed, the request ends without a row on j
    never = np.zeros((T + 1, M))
    never[T] = 1.0  # finished
    zero = np.where(commit == 0, P, 0.0)
    zero[j] = 0.0  # a row on j itself counts as a visit: never = 0 there
    solve = np.linalg.inv(np.eye(M) - zero)
    last = np.zeros(T)
    for t in range(T - 1, -1, -1):
        ahead = np.array([sum(P[i, m] * never[min(t + commit[i, m], T), m]
                              for m in range(M) if P[i, m] > 0 and commit[i, m] > 0) for i in range(M)])
        ahead[j] = 0.0
        never[t] = solve @ ahead
        last[t] = sum(P[j, m] * (never[min(t + commit[j, m], T), m] if commit[j, m] > 0 or m != j else 0.0)
                      for m in range(M) if P[j, m] > 0)
    return last


def per_row_charge(P: np.ndarray, C: np.ndarray, prefill: PrefillCosts) -> np.ndarray:
    """Expected seconds a row on model i costs beyond a decode row, per model (0 where never run)."""
    load = request_load(P, C, prefill)
    extra = np.asarray(prefill.per_token_s) * (load.fed - load.rows) + np.asarray(prefill.arrival) * load.arrivals
    return np.divide(extra, load.rows, out=np.zeros(len(P)), where=load.rows > 0)


def charged(latencies: np.ndarray, P: np.ndarray, C: np.ndarray, prefill: PrefillCosts | None) -> np.ndarray:
    """The chain's step latencies: a batch of b rows on model i costs L_i(b) + b times its charge per row."""
    if prefill is None:
        return latencies
    batch = np.arange(1, latencies.shape[1] + 1)
    return latencies + per_row_charge(P, C, prefill)[:, None] * batch[None, :]


def feed_cost(prefill: PrefillCosts, model: int, tokens: int, arrived: bool) -> float:
    """Seconds one row feeding ``tokens`` adds to its step beyond a decode row."""
    return prefill.per_token_s[model] * max(tokens - 1, 0) + (prefill.arrival[model] if arrived else 0.0)

