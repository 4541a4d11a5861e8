"""validate_sampling as the Triton frontend calls it: numpy scalars, no vocabulary yet, and the
values TensorRT-LLM accepts (top_p 0, min_tokens above max_tokens, a -inf bias). The refusals of
each field are in test_api.py (through a running engine, other requests going on)."""

from __future__ import annotations

import numpy as np
import pytest

from tokenrouter.request_builder import RequestError, validate_sampling

BASE = {"max_tokens": np.int32(8), "temperature": np.float32(0.7), "top_p": np.float32(0.0), "top_k": np.int32(0)}


def test_what_tensorrt_llm_accepts_is_accepted():
    validate_sampling(**BASE, repetition_penalty=np.float32(0.5), presence_penalty=np.float32(-1.0),
                      frequency_penalty=np.float32(2.0), min_tokens=np.int32(20), return_log_probs=np.bool_(True),
                      logit_bias=[(np.int32(3), np.float32(-np.inf)), (3, 1.0)])


def test_bias_ids_wait_for_the_vocabulary():
    validate_sampling(**BASE, logit_bias=[(10**6, 1.0)])  # the frontend does not know it
    with pytest.raises(RequestError, match="logit_bias token id 1000000"):
        validate_sampling(**BASE, logit_bias=[(10**6, 1.0)], vocab_size=4096)


@pytest.mark.parametrize("field,value", [("repetition_penalty", np.float32(np.nan)), ("min_tokens", np.float32(2)),
                                         ("presence_penalty", np.bool_(True)), ("return_log_probs", np.int32(1))])
def test_numpy_values_of_the_wrong_kind_are_refused_by_name(field, value):
    with pytest.raises(RequestError, match=field):
        validate_sampling(**BASE, **{field: value})
