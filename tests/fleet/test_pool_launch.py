"""What `tokenrouter fleet --pools M+K` starts, before anything runs (the deployment itself:
test_pools_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.fleet.launcher import parse_pools, pool_workers
from tokenrouter.launch.serve import TINY_CONFIG


def test_one_entry_worker_and_k_peer_workers_are_taken():
    assert parse_pools("1+1") == (1, 1)
    assert parse_pools("1+4") == (1, 4)


@pytest.mark.parametrize("text", ["2+2", "0+1", "1+0"])
def test_what_is_not_served_is_refused_with_the_reason(text):
    with pytest.raises(SystemExit, match="one entry worker and at least one peer worker"):
        parse_pools(text)


@pytest.mark.parametrize("text", ["1", "a+b", "1+2+3", "1-2"])
def test_a_malformed_split_is_refused_with_the_form(text):
    with pytest.raises(SystemExit, match="give M\\+K"):
        parse_pools(text)


def test_the_workers_are_the_entry_then_k_per_peer_model_each_with_its_own_log_and_status_port(tmp_path):
    workers = pool_workers(Path(TINY_CONFIG), "tokenrouter", tmp_path, 30000, 3)
    assert [w.name for w in workers] == ["entry worker", "peer worker llm 0", "peer worker llm 1",
                                         "peer worker llm 2"]
    assert "tokenrouter.fleet.entry_engine" in workers[0].command
    assert all(w.command[w.command.index("--model") + 1] == "llm" for w in workers[1:])
    assert len({w.log for w in workers}) == 4
    assert [w.env["DYN_SYSTEM_PORT"] for w in workers] == ["30000", "30001", "30002", "30003"]
