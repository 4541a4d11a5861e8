"""``batch_threshold: auto`` with one subserver per process, the way Triton runs them.

Each subserver is assembled alone (no shared estimator), as the Triton glue does: it gets an
estimator of its own and trades what it observes of its model with the peers through
``estimates`` messages. Simulated engines, so the test runs the real loops at speed.
"""

from __future__ import annotations

import time

from tokenrouter.config import load_config
from tokenrouter.engine.factory import create_engine
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.assembly import build_policy, build_subserver, kv_capacity
from tokenrouter.runtime.observers import ThresholdFeed
from tokenrouter.runtime.strategies import make_strategy
from tokenrouter.runtime.transport import InProcessTransport

CONFIG = {
    "models": {
        # A large model whose step cost is almost all fixed: batching it pays, so B* > 1 there.
        "slm": {"engine": "simulated", "profile": {"base": "tiny-cpu-small", "base_ms": 0.5},
                "batch_threshold": "auto"},
        "llm": {"engine": "simulated", "profile": {"base": "tiny-cpu-large", "base_ms": 8.0, "per_row_ms": 0.05},
                "batch_threshold": "auto"},
    },
    "policy": {"name": "random", "params": {"rate": 0.3, "seed": 1}},
    "scheduling": {"max_active": 4, "max_wait_ms": 20},
}


class Done:
    def __init__(self) -> None:
        self.finished = 0
        self.errors: list[str] = []

    def on_output(self, tokens, origins, finish_reason=None, error=None, logprobs=None) -> None:
        self.finished += finish_reason is not None
        if error is not None:
            self.errors.append(error)


def test_each_process_estimator_solves_from_shared_observations_and_applies_b_above_one():
    """The reported bug: 'auto' failed at Triton load ("no online estimator was given"). Also
    catches per-process estimators that never hear the other model (they would never be ready
    and B would stay 1)."""
    config = load_config(CONFIG)
    transport = InProcessTransport()
    strategy = make_strategy("tokenrouter", 2)
    capacities = {name: kv_capacity(spec) for name, spec in config.models.items()}
    servers = {}
    for name in config.model_names:  # one "process" each: no auto passed in
        engine = create_engine(name, config.models[name])
        servers[name] = build_subserver(config, name, engine, build_policy(config), transport, strategy,
                                        max_model_len=engine.max_model_len, capacities=capacities)
        transport.connect(name, servers[name].deliver)
    estimators = {name: next(o for o in s.observers if isinstance(o, ThresholdFeed)).auto
                  for name, s in servers.items()}
    assert estimators["slm"] is not estimators["llm"]
    for server in servers.values():
        server.start()
    try:
        sink, submitted, deadline = Done(), 0, time.monotonic() + 60
        while not all(auto.generation >= 1 for auto in estimators.values()) and time.monotonic() < deadline:
            while submitted - sink.finished < 8:
                servers["slm"].submit(f"r{submitted}", [3 + submitted % 50, 7, 9],
                                      RequestSpec(prompt_len=3, max_tokens=24), sink)
                submitted += 1
            time.sleep(0.05)
        assert all(auto.generation >= 1 for auto in estimators.values()), \
            {name: (auto.estimates().ready, auto.last_error) for name, auto in estimators.items()}
        assert sink.errors == []
        # Each process solved with both models' observations (each sees its own a little fresher);
        # both find that batching the large model pays, and its scheduler reads that B.
        assert all(auto.thresholds(4)[1] > 1 for auto in estimators.values()), \
            {name: auto.thresholds(4) for name, auto in estimators.items()}
        assert servers["llm"].core.threshold(4) == estimators["llm"].thresholds(4)[1]
    finally:
        for server in servers.values():
            server.stop()
