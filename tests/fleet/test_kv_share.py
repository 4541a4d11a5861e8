"""What each of M entry workers admits against: M entries admitting as much as they can never reserve
more of the peer model's KV than one peer instance holds (so no peer instance is over-committed,
wherever the requests are pinned), while each keeps its own model's KV whole."""

from __future__ import annotations

import pytest

from tokenrouter.config import load_config
from tokenrouter.fleet.kv_share import entry_capacities
from tokenrouter.launch.serve import TINY_CONFIG
from tokenrouter.request_builder import build_spec
from tokenrouter.runtime.admission import Admission, QueueLimits
from tokenrouter.runtime.assembly import kv_capacity
from tokenrouter.runtime.request import Submission

LIMITS = QueueLimits(max_active=1000, max_queue=1000, queue_timeout_s=0, max_bypass=0)


def admit_all(admission: Admission, entry: int, prompt_len: int, max_tokens: int) -> int:
    """Admits requests at one entry until the next does not fit; how many it took."""
    spec = build_spec(prompt_len, {"max_tokens": max_tokens})
    count = 0
    while True:
        admission.waiting.append(Submission(f"e{entry}-{count}", [1] * prompt_len, spec, sink=None))  # type: ignore[arg-type]
        if admission.admit_next(active=count) is None:
            return count
        count += 1


@pytest.mark.parametrize("entries", [2, 3])
def test_m_entries_together_reserve_at_most_one_peer_instance_of_kv_and_each_its_own_model_whole(entries):
    config = load_config(TINY_CONFIG)
    whole = {model: kv_capacity(spec) for model, spec in config.models.items()}
    admissions = [Admission(entry_capacities(config, entries), LIMITS) for _ in range(entries)]
    admitted = [admit_all(admission, m, prompt_len=40, max_tokens=88) for m, admission in enumerate(admissions)]
    assert all(admitted)  # each entry serves
    assert sum(a.reserved["llm"] for a in admissions) <= whole["llm"][0]
    assert all(a.capacities["slm"] == whole["slm"] for a in admissions)  # its own engine's KV is its own
    assert sum(admitted) * 8 >= whole["llm"][0] * 0.9  # (8 blocks each): the share is used, not wasted


def test_one_entry_admits_against_the_whole_instance_and_zero_entries_are_refused():
    config = load_config(TINY_CONFIG)
    assert entry_capacities(config, 1) == {model: kv_capacity(spec) for model, spec in config.models.items()}
    with pytest.raises(ValueError, match="entries"):
        entry_capacities(config, 0)
