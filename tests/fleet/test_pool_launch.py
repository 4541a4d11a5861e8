"""What `tokenrouter fleet --pools M+K` starts, before anything runs (the deployment itself:
test_pools_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.fleet.launcher import parse_pools, pool_workers
from tokenrouter.launch.serve import TINY_CONFIG


def test_m_entry_workers_and_k_peer_workers_are_taken():
    assert parse_pools("1+1") == (1, 1)
    assert parse_pools("1+4") == (1, 4)
    assert parse_pools("3+2") == (3, 2)


@pytest.mark.parametrize("text", ["0+1", "1+0", "0+0"])
def test_an_empty_pool_is_refused_with_the_reason(text):
    with pytest.raises(SystemExit, match="at least one entry worker and one peer worker"):
        parse_pools(text)


@pytest.mark.parametrize("text", ["1", "a+b", "1+2+3", "1-2"])
def test_a_malformed_split_is_refused_with_the_form(text):
    with pytest.raises(SystemExit, match="give M\\+K"):
        parse_pools(text)


def test_the_workers_are_m_entries_then_k_peers_each_with_its_own_log_and_status_port(tmp_path):
    workers = pool_workers(Path(TINY_CONFIG), "tokenrouter", tmp_path, 30000, 2, 3)
    assert [w.name for w in workers] == ["entry worker 0", "entry worker 1", "peer worker llm 0",
                                         "peer worker llm 1", "peer worker llm 2"]
    for entry in workers[:2]:  # each admits against its share of a peer instance's KV
        assert "tokenrouter.fleet.entry_engine" in entry.command
        assert entry.command[entry.command.index("--entries") + 1] == "2"
    assert all(w.command[w.command.index("--model") + 1] == "llm" for w in workers[2:])
    assert len({w.log for w in workers}) == 5
    assert [w.env["DYN_SYSTEM_PORT"] for w in workers] == ["30000", "30001", "30002", "30003", "30004"]
