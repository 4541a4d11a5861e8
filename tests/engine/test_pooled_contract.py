"""The sequence bookkeeping every PooledEngine shares, on the paged torch engine and the simulated one."""

from __future__ import annotations

import pytest

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import Engine, StepRow, UnknownSequence
from tokenrouter.engine.simulated import SimulatedEngine


@pytest.fixture(params=["torch", "simulated"])
def engine(request, tiny_pair, make_engine) -> Engine:
    if request.param == "torch":
        return make_engine(tiny_pair["small"], block_size=4, kv_cache_tokens=64)
    spec = ModelSpec(engine="simulated", profile={"base": "tiny-cpu-small", "time_scale": 0.0}, block_size=4,
                     kv_cache_tokens=64)
    return SimulatedEngine.from_spec("slm", spec)


def test_sequence_bookkeeping(engine: Engine) -> None:
    engine.add_sequence("a")
    with pytest.raises(ValueError):
        engine.add_sequence("a")
    assert engine.has_sequence("a") and engine.sequence_ids() == ["a"] and engine.num_cached("a") == 0
    with pytest.raises(UnknownSequence):
        engine.num_cached("ghost")
    with pytest.raises(ValueError):
        engine.step([StepRow("a", [5])], top_logits=-1)
    assert engine.release("a") and not engine.release("a") and not engine.has_sequence("a")
