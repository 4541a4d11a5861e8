"""A request's log probabilities: one float per output token, whoever computed it."""

from __future__ import annotations

import pytest

from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.request import RequestState


def _request(prompt_len: int = 2) -> RequestState:
    spec = RequestSpec(prompt_len=prompt_len, max_tokens=8, return_log_probs=True)
    return RequestState(rid="r", model="slm", model_index=0, token_ids=list(range(prompt_len)),
                        prompt_len=prompt_len, origins=[], spec=spec)


def test_a_peers_suffix_may_leave_prompt_positions_without_log_probabilities():
    request = _request()
    grown = request.apply_suffix(1, [1, 7, 8], [-1, 1, 1], [None, -0.5, -0.25])
    assert grown == 2 and request.logprobs == [-0.5, -0.25]


def test_an_output_token_without_a_log_probability_is_refused_naming_the_request():
    request = _request()
    with pytest.raises(ValueError, match="request r: an output token without a log probability"):
        request.apply_suffix(2, [7, 8], [1, 1], [-0.5, None])
    with pytest.raises(ValueError, match="request r: an output token without a log probability"):
        request.commit([7], [0], [None])


def test_a_refused_suffix_or_commit_changes_nothing():
    request = _request()
    request.commit([7], [0], [-0.5])
    before = (list(request.token_ids), list(request.origins), list(request.logprobs))
    for refused in (lambda: request.apply_suffix(3, [8, 9], [1, 1], [-0.1, None]),
                    lambda: request.apply_suffix(3, [8, 9], [1, 1], [-0.1]),
                    lambda: request.commit([8], [0], [None])):
        with pytest.raises(ValueError):
            refused()
        assert (request.token_ids, request.origins, request.logprobs) == before
