"""Summary arithmetic on hand-made records, reading a Prometheus histogram, CPU of a process group."""

from __future__ import annotations


import pytest

from tokenrouter_tools.bench import prometheus
from tokenrouter_tools.bench.records import RequestRecord, Window, summarize


def record(submitted: float, arrivals: list[tuple[float, int]], finished: float | None, reason: str | None,
           models: dict[str, int]) -> RequestRecord:
    r = RequestRecord(submitted=submitted, arrivals=list(arrivals), finished=finished, finish_reason=reason)
    r.tokens_by_model.update(models)
    return r


def test_summary_counts_only_what_happened_inside_the_window():
    window = Window(10.0, 20.0)
    records = [
        # started in the warm-up, finished inside: 2 of its 5 tokens arrived inside
        record(5.0, [(6.0, 3), (12.0, 2)], 12.0, "length", {"slm": 4, "llm": 1}),
        # entirely inside
        record(11.0, [(11.5, 1), (13.0, 3)], 14.0, "eos", {"slm": 2, "llm": 2}),
        # cut at the window's end: its tokens inside count for throughput, not for latency
        record(15.0, [(16.0, 4), (20.0, 9)], 20.0, "cancelled", {"slm": 4}),
    ]
    s = summarize(records, window, clients=2, large="llm", steps={"slm": [(9.0, 11.0), (19.0, 21.0)], "llm": []})
    assert s.output_tokens == 2 + 4 + 4 and s.throughput == pytest.approx(10 / 10.0)
    assert (s.finished, s.cut, s.errors) == (2, 1, 0)
    assert s.latency_median_s == pytest.approx((7.0 + 3.0) / 2)
    assert s.ttft_median_s == pytest.approx((0.5 + 1.0) / 2)  # the first record's first token came before
    assert s.per_user_median_tok_s == pytest.approx((5 / 7.0 + 4 / 3.0) / 2)
    assert s.large_share == pytest.approx(3 / 13)
    assert s.busy == {"slm": pytest.approx(2 / 10), "llm": 0.0}


def test_record_accumulates_arrivals_and_attribution():
    r = RequestRecord(submitted=1.0)
    r.add(2, ["slm", "llm"], at=1.5)
    r.add(0, at=1.6)  # nothing new: no arrival
    r.add(1, ["slm"], at=2.0)
    r.finish("eos", [5, 6, 7])
    assert r.arrivals == [(1.5, 2), (2.0, 1)] and r.output_tokens == 3
    assert r.ttft == pytest.approx(0.5) and r.complete and dict(r.tokens_by_model) == {"slm": 2, "llm": 1}


METRICS = """# HELP tokenrouter_peer_send_seconds Round trip of one peer-message call
# TYPE tokenrouter_peer_send_seconds histogram
tokenrouter_peer_send_seconds_count{model="slm"} %d
tokenrouter_peer_send_seconds_sum{model="slm"} %f
tokenrouter_peer_send_seconds_bucket{model="slm",le="0.0005"} %d
tokenrouter_peer_send_seconds_bucket{model="slm",le="0.001"} %d
tokenrouter_peer_send_seconds_bucket{model="slm",le="+Inf"} %d
nv_inference_count{model="slm",version="1"} 3
"""


def test_histogram_difference_between_two_scrapes():
    before = prometheus.parse(METRICS % (10, 0.004, 10, 10, 10))
    after = prometheus.parse(METRICS % (30, 0.024, 12, 26, 30))
    delta = prometheus.histogram_delta(before, after, "tokenrouter_peer_send_seconds")
    assert delta == {"slm": {"count": 20, "mean_s": pytest.approx(0.001), "p50_le_s": 0.001, "p90_le_s": float("inf")}}
    assert prometheus.histogram_delta(after, after, "tokenrouter_peer_send_seconds") == {}

