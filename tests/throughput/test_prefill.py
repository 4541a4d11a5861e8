"""The prefill and extend charges of the throughput model against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from tokenrouter.throughput import predict
from tokenrouter.throughput.montecarlo import simulate
from tokenrouter.throughput.prefill import PrefillCosts, feed_cost, per_row_charge, request_load

R2R_P = np.array([[0.75, 0.25], [1.0, 0.0]])  # small -> large with 0.25, the small token dropped
R2R_C = np.array([[1.0, 0.0], [1.0, 0.0]])  # the large model writes one token and hands back
PING_P = np.array([[0.0, 1.0], [1.0, 0.0]])  # strict alternation, both models commit
PING_C = np.array([[0.0, 1.0], [1.0, 0.0]])
DELTA = 1e-4


def costs(per_token=(1e-3, 2e-3), prompt=(10, 10), output=4, arrival=None) -> PrefillCosts:
    return PrefillCosts(per_token, prompt, output, arrival)


def test_alternation_feeds_the_prompt_once_per_model_and_two_tokens_per_return() -> None:
    # Output 4: small at levels 0, 2; large at 1, 3. The small model feeds the prompt (10), then the
    # 2 tokens committed since; the large one the prompt and the small model's token (11), then 2.
    load = request_load(PING_P, np.ones((2, 2)) - np.eye(2), costs(prompt=(8, 12)))
    assert load.rows.tolist() == pytest.approx([2, 2])
    assert load.arrivals.tolist() == pytest.approx([2, 2])
    assert load.fed.tolist() == pytest.approx([10 + 2, 10 + 3])


def test_alternation_charge_per_row() -> None:
    prefill = costs(arrival=(5e-3, 7e-3))
    # small: extra tokens 12 - 2 = 10 over 2 rows, two arrivals; large: 13 - 2 = 11 over 2 rows
    expected = [(1e-3 * 10 + 2 * 5e-3) / 2, (2e-3 * 11 + 2 * 7e-3) / 2]
    assert per_row_charge(PING_P, np.ones((2, 2)) - np.eye(2), prefill).tolist() == pytest.approx(expected)


def test_r2r_rows_arrivals_and_fed_tokens_by_hand() -> None:
    p, T, prompt = 0.25, 2, 10
    load = request_load(R2R_P, R2R_C, costs(output=T, prompt=(prompt, prompt)))
    # one small row per committed token; a large row after a quarter of them
    assert load.rows.tolist() == pytest.approx([T, p * T])
    # the start, and every return except from a large row that wrote the last token
    assert load.arrivals.tolist() == pytest.approx([1 + p * (T - 1), p * T])
    # small: fed up to its last row at level T - 1. large: a row at level 1 is its last; a row at
    # level 0 is last unless level 1 also routes
    assert load.fed[0] == pytest.approx(prompt + T - 1)
    assert load.fed[1] == pytest.approx(p * (1 - p) * prompt + p * (prompt + 1))


def test_one_model_one_request_is_the_closed_form() -> None:
    # T steps per request; the first prefills the prompt: (prompt - 1) tokens past the first and
    # one arrival. Exact in the chain and in the simulation (a fixed prompt: nothing random).
    L, T, prompt = 4e-3, 8, 31
    prefill = PrefillCosts((1e-4,), (prompt, prompt), T, (2e-3,))
    expected = T / (T * L + 1e-4 * (prompt - 1) + 2e-3)
    assert predict([[1.0]], [[1.0]], [L], [1], 1, 1e-7, snap=True, prefill=prefill) == pytest.approx(expected,
                                                                                                    rel=1e-4)
    assert simulate([[1.0]], [[1.0]], [L], [1], 1, events=8000, warmup=0, prefill=prefill) == \
        pytest.approx(expected, rel=1e-6)


def test_alternation_one_request_is_the_closed_form() -> None:
    # Output 4, prompt 10, both models: 2 rows each; the charges of one request over its 4 steps.
    L = [3e-3, 9e-3]
    prefill = costs(arrival=(5e-4, 7e-4))
    charges = 1e-3 * 10 + 2 * 5e-4 + 2e-3 * 11 + 2 * 7e-4
    expected = 4 / (2 * sum(L) + charges)
    C = np.ones((2, 2)) - np.eye(2)
    assert predict(PING_P, C, L, [1, 1], 1, 1e-6, snap=True, prefill=prefill) == pytest.approx(expected, rel=1e-4)
    assert simulate(PING_P, C, L, [1, 1], 1, events=4000, warmup=0, prefill=prefill) == pytest.approx(expected,
                                                                                                       rel=1e-6)


def test_the_sim_a100_pair_with_long_prompts_needs_the_charges() -> None:
    # The simulated A100 pair on long-short requests (1024-2048 prompt tokens, 32 out): the large
    # model's first visit prefills ~1.5k tokens at 0.05 ms each, twice its step. The chain with the
    # charges lands near the simulation that follows every request; without them it is far off.
    N = 4
    L = [[(6.0 + 0.1 * b) / 1e3 for b in range(N)], [(27.9 + 0.4 * b) / 1e3 for b in range(N)]]
    prefill = PrefillCosts((1e-5, 5e-5), (1024, 2048), 32)
    P, C = [[0.65, 0.35], [1.0, 0.0]], [[1, 0], [1, 0]]
    simulated = simulate(P, C, L, [1, 1], N, events=20_000, prefill=prefill)
    charged = predict(P, C, L, [1, 1], N, DELTA, snap=True, prefill=prefill)
    decode_only = predict(P, C, L, [1, 1], N, DELTA, snap=True)
    assert charged == pytest.approx(simulated, rel=0.08)
    assert decode_only > 1.3 * simulated


def test_without_charges_the_simulation_is_unchanged() -> None:
    args = ([[0.65, 0.35], [1.0, 0.0]], [[1, 0], [1, 0]], [6e-3, 27.9e-3], [1, 2], 3)
    assert simulate(*args, events=2000) == simulate(*args, events=2000, prefill=None)


def test_feed_cost_per_row() -> None:
    prefill = costs(arrival=(5e-4, 7e-4))
    assert feed_cost(prefill, 0, 1, False) == 0.0  # a decode row
    assert feed_cost(prefill, 1, 1, True) == pytest.approx(7e-4)  # a one-token resume
    assert feed_cost(prefill, 1, 6, True) == pytest.approx(5 * 2e-3 + 7e-4)


@pytest.mark.parametrize("kwargs, message", [
    ({"per_token": (1e-3,)}, "per_token_s needs one value per model"),
    ({"per_token": (-1.0, 0.0)}, ">= 0 seconds"),
    ({"prompt": (0, 3)}, "prompt_tokens"),
    ({"prompt": (5, 3)}, "prompt_tokens"),
    ({"output": 0}, "output_tokens"),
    ({"arrival": (1.0,)}, "arrival_s needs one value per model"),
])
def test_bad_costs_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        per_row_charge(R2R_P, R2R_C, costs(**kwargs))


def test_fractional_tokens_and_stays_without_a_token_are_refused() -> None:
    with pytest.raises(ValueError, match="whole tokens"):
        request_load(R2R_P, np.array([[1.0, 0.5], [1.0, 0.0]]), costs())
    with pytest.raises(ValueError, match="must commit its token"):
        request_load(R2R_P, np.array([[0.0, 0.0], [1.0, 0.0]]), costs())
