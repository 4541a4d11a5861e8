"""Pools of workers per model: reduction to the pair, independent pairs against the chain, placement,
the per-group deadlock guard, sanity of the split search, and the command."""

from __future__ import annotations

import re

import pytest

from tokenrouter.launch.cli import main
from tokenrouter.throughput import predict
from tokenrouter.throughput.inputs import check_pool_thresholds, placement
from tokenrouter.throughput.montecarlo import simulate
from tokenrouter.throughput.pools import best_split, predict_pools, splits_of

PAPER_P = [[0.65, 0.35], [1.0, 0.0]]
PAPER_C = [[1, 0], [1, 0]]
PAPER_L = [6.0e-3, 27.9e-3]
DELTA = 1e-4


def _sloped(N: int) -> list[list[float]]:
    """The simulated A100 pair: 6.0 / 27.9 ms at one row, 0.1 / 0.4 ms more per row."""
    return [[(6.0 + 0.1 * b) * 1e-3 for b in range(N)], [(27.9 + 0.4 * b) * 1e-3 for b in range(N)]]


@pytest.mark.parametrize("B, N", [([1, 1], 2), ([1, 3], 4), ([2, 2], 6)])
def test_one_worker_per_model_is_the_pair(B: list[int], N: int) -> None:
    """M = K = 1 is today's pair: the same simulation run for run, and the chain within 2 %."""
    pooled = predict_pools(PAPER_P, PAPER_C, PAPER_L, B, N, [1, 1], delta=DELTA, events=40_000, seed=1)
    assert pooled.simulated == simulate(PAPER_P, PAPER_C, PAPER_L, B, N, events=40_000, seed=1)
    assert pooled.chain == pytest.approx(predict(PAPER_P, PAPER_C, PAPER_L, B, N, DELTA), rel=1e-12)
    assert pooled.simulated == pytest.approx(pooled.chain, rel=0.02)


@pytest.mark.parametrize("workers, N, B", [((2, 2), 8, [1, 2]), ((3, 3), 7, [1, 1])])
def test_equal_pools_are_independent_pairs(workers: tuple[int, int], N: int, B: list[int]) -> None:
    """k workers per model with pinned requests are k pairs: the simulation of the pools agrees with
    the chain of each pair on its share of the requests (7 over 3 pairs: 3, 2 and 2)."""
    pooled = predict_pools(PAPER_P, PAPER_C, _sloped(N), B, N, workers, delta=DELTA, events=60_000, seed=2)
    shares = [len(range(group, N, workers[0])) for group in range(workers[0])]
    expected = sum(predict(PAPER_P, PAPER_C, _sloped(n), B, n, DELTA) for n in shares)
    assert pooled.chain == pytest.approx(expected, rel=1e-12)
    assert pooled.simulated == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("workers", [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2)])
def test_a_compute_bound_bottleneck_scales_with_its_workers(workers: tuple[int, int]) -> None:
    """Closed form where the chain has none: the large model takes 4 ms per row (L proportional to the
    batch) against a 1 ms small step, and 80 % of the small model's rows go to it. It is the bottleneck,
    always busy: K workers pass K / 4 ms rows, and each visit commits 1 token plus the small model's
    stays before the next visit (0.2 / 0.8 on average): 312.5 K tokens/s, whatever the small pool."""
    N = 8
    L = [[1e-3] * N, [4e-3 * b for b in range(1, N + 1)]]
    pooled = predict_pools([[0.2, 0.8], [1.0, 0.0]], PAPER_C, L, [1, 1], N, workers, events=40_000)
    assert pooled.simulated == pytest.approx(312.5 * workers[1], rel=0.01)


def test_placement_is_least_loaded_round_robin() -> None:
    pinned = placement(7, [2, 3])
    assert pinned.tolist() == [[0, 0], [1, 1], [0, 2], [1, 0], [0, 1], [1, 2], [0, 0]]
    for model, count in enumerate([2, 3]):  # every instance within one request of the others
        load = [int((pinned[:, model] == x).sum()) for x in range(count)]
        assert max(load) - min(load) <= 1


def test_deadlock_guard_is_per_group_of_instances() -> None:
    """The pair's rule over all N would pass each of these (1 + 3 < 8, 4 + 1 < 8)."""
    check_pool_thresholds([2, 4], [1, 1], 8)
    with pytest.raises(ValueError, match=r"group of \[1, 1\] instances shares 4 requests"):
        check_pool_thresholds([2, 4], [2, 2], 8)  # two pairs of 4 requests: 1 + 3 >= 4
    with pytest.raises(ValueError, match=r"group of \[1, 4\] instances shares 8 requests"):
        check_pool_thresholds([5, 2], [1, 4], 8)  # the entry holds 4, each large worker 1: 8 >= 8
    check_pool_thresholds([4, 2], [1, 4], 8)


@pytest.mark.parametrize("kwargs, message", [
    (dict(workers=[1, 0]), "between 1 and N"),
    (dict(workers=[1, 9]), "between 1 and N"),
    (dict(workers=[1]), "one instance count per model"),
    (dict(B=[1, 5], workers=[1, 2]), "would never start"),
    (dict(B=[1, 3], N=5, workers=[1, 2]), "holds only 2 of the N = 5"),
    (dict(B=[5, 5], workers=[1, 1]), "can deadlock"),
])
def test_bad_pool_inputs_raise_clear_errors(kwargs: dict, message: str) -> None:
    args = dict(P=PAPER_P, C=PAPER_C, L=PAPER_L, B=[1, 1], N=8, workers=[1, 1]) | kwargs
    with pytest.raises(ValueError, match=message):
        predict_pools(**args, events=100)


def test_splits_of_a_budget() -> None:
    assert splits_of(4, 2) == [(1, 3), (2, 2), (3, 1)]
    assert len(splits_of(6, 3)) == 10
    with pytest.raises(ValueError, match="budget"):
        splits_of(1, 2)


def test_more_workers_never_hurt_and_the_limiting_pool_gets_them() -> None:
    """Sanity: adding a worker to either pool does not lower throughput by more than noise and phase
    (with eager batching a third entry worker coupled to two large ones spreads their arrivals into
    smaller steps: 3 + 2 is 0.4 % under 2 + 2 at p = 0.35), and the best split of a budget moves toward
    the large model when it is the bottleneck and away from it when it is not."""
    N, L = 12, _sloped(12)
    for P in ([[0.65, 0.35], [1.0, 0.0]], [[0.95, 0.05], [1.0, 0.0]]):
        base = predict_pools(P, PAPER_C, L, [1, 1], N, [2, 2], events=10_000).simulated
        for workers in ([3, 2], [2, 3]):
            assert predict_pools(P, PAPER_C, L, [1, 1], N, workers, events=10_000).simulated >= 0.98 * base
    heavy, _ = best_split([[0.2, 0.8], [1.0, 0.0]], PAPER_C, L, [1, 1], N, 6, events=10_000)
    light, _ = best_split([[0.95, 0.05], [1.0, 0.0]], PAPER_C, L, [1, 1], N, 6, events=10_000)
    assert heavy[1] > heavy[0] and light[1] < heavy[1]


def test_best_split_leaves_out_splits_that_could_deadlock() -> None:
    best, predictions = best_split(PAPER_P, PAPER_C, PAPER_L, [1, 3], 6, 4, events=2_000)
    assert [p.workers for p in predictions] == [(2, 2), (3, 1)]  # 1 + 3: 2 requests per large worker < 3
    assert best in {(2, 2), (3, 1)}
    with pytest.raises(ValueError, match="no split of 4 workers"):
        best_split(PAPER_P, PAPER_C, PAPER_L, [3, 5], 6, 4, events=2_000)


def test_threshold_search_finds_the_chains_best_thresholds() -> None:
    """With one worker per model the search over B is the pair's: the chain's B* at N = 4 is [1, 3]
    (207.95 tokens/s, 6 % above the next), and the search runs every feasible B in {1..4}^2."""
    best, [prediction] = best_split(PAPER_P, PAPER_C, PAPER_L, [1, 1], 4, 2, search_B=4, events=20_000)
    assert best == (1, 1) and prediction.B == (1, 3)
    assert prediction.simulated == pytest.approx(predict(PAPER_P, PAPER_C, PAPER_L, [1, 3], 4, DELTA), rel=0.02)


def test_command_prints_every_split_and_the_best(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["throughput", "--P", "0.2,0.8;1,0", "--C", "1,0;1,0", "--L-ms", "6.0", "27.9", "--L-slope-ms", "0.1",
            "0.4", "--N", "8", "--pools", "4", "--monte-carlo", "5000", "--pairs-chain", "--delta-ms", "0.1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^([* ]) (\d) \+ (\d)\s+\[1, 1\]\s+([\d.]+)\s+([\d.]+)\s+(\S+)$", out, re.MULTILINE)
    assert [(r[1], r[2]) for r in rows] == [("1", "3"), ("2", "2"), ("3", "1")]
    assert [r[5] for r in rows] == ["-", rows[1][5], "-"] and float(rows[1][5]) > 0  # the chain: 2 pairs only
    best = max(rows, key=lambda r: float(r[3]))
    assert best[0] == "*" and f"best split = {best[1]} + {best[2]}, B = [1, 1]" in out
    assert "2 pairs:" in out


@pytest.mark.parametrize("argv, message", [
    (["--paper", "--pools", "1"], "budget"),
    (["--P", "1,0;1,0", "--C", "1,0;1,0", "--L-ms", "6", "--N", "4", "--pools", "2"], "one latency per model"),
    (["--paper", "--L-slope-ms", "0.1", "--pools", "4"], "one slope per model"),
    (["--paper", "--pools", "2", "--search-B", "-1"], "search_B must be an integer >= 0"),
])
def test_command_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["throughput", *argv]) == 2
    assert message in capsys.readouterr().err
