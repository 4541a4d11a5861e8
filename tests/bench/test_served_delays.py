"""The served suite's injected peer delay without a server: what a delay adds to `bench served` is a
system name that carries it, a placed config that sets it and a comparison with no delay that is
measured, not judged. (The link's holding of each batch is tests/serving/test_peer_link.py's; the
two-node deployment with a delay runs under `-m slow` in tests/e2e/test_bench_target.py.)"""

from __future__ import annotations

from pathlib import Path

from tokenrouter.config import load_config
from tokenrouter_tools.bench.placed import free_ports, on_loopback
from tokenrouter_tools.bench.served import TWO_SERVERS, _compare, delay_comparisons, peer_delay_ms, two_servers

from helpers.routing import routing_config


def test_a_delay_names_its_system_and_the_name_gives_it_back() -> None:
    assert (two_servers(0.0), peer_delay_ms(TWO_SERVERS)) == (TWO_SERVERS, 0.0)
    assert two_servers(2.0) == "two-servers+2ms"
    for delay in (0.5, 2.0, 12.25):
        assert peer_delay_ms(two_servers(delay)) == delay


def test_each_model_is_placed_on_its_own_server_with_the_delay(tiny_pair: dict[str, Path]) -> None:
    config = load_config(routing_config(tiny_pair))
    ports = dict(zip(config.model_names, free_ports(len(config.models))))
    delayed = on_loopback(config, ports, 2.0)
    assert delayed.transport.delay_ms == 2.0
    assert {name: spec.server for name, spec in delayed.models.items()} == {
        name: f"127.0.0.1:{ports[name].grpc}" for name in config.model_names}
    assert on_loopback(config, ports).transport.delay_ms == config.transport.delay_ms == 0.0


def _run(throughput: float, server_cpu_ms: float) -> dict:
    """The part of a served run's row a comparison reads."""
    return {"throughput": throughput, "ttft_median_s": 0.01, "handoffs_per_token": 0.5,
            "cpu_ms_per_token": {"server": server_cpu_ms, "server by process": {}}}


def test_each_delay_is_compared_with_none_paired_by_repetition_and_not_judged() -> None:
    assert [c.name for c in delay_comparisons([0.0, 2.0, 0.5])] == ["two-servers+2ms / two-servers",
                                                                    "two-servers+0.5ms / two-servers"]
    [comparison] = delay_comparisons([2.0])
    rows = {"two-servers+2ms": [_run(5.0, 3.0), _run(6.0, 3.0)], "two-servers": [_run(10.0, 1.0), _run(8.0, 1.0)]}
    medians = {system: {"cpu_ms_per_token": runs[0]["cpu_ms_per_token"]} for system, runs in rows.items()}
    compared = _compare(comparison, rows, medians)
    assert compared["throughput"]["per_rep"] == [0.5, 0.75]  # each rep against its neighbour, not the medians
    assert compared["throughput"]["verdict"] == compared["ttft"]["verdict"] == compared["server_cpu"]["verdict"] == "-"
    assert compared["server_cpu"]["total_difference_ms"] == 2.0
