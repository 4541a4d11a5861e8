"""Busy spans rebuilt from a served runtime's busy-seconds counter: what each read adds, and where."""

from __future__ import annotations

import pytest

from tokenrouter_tools.bench import prometheus
from tokenrouter_tools.bench.busy_sampler import busy_by_model, spans_from_reads
from tokenrouter_tools.bench.records import Window


def test_each_reads_growth_is_one_span_ending_at_that_read():
    reads = [(10.0, {"slm": 1.0, "llm": 5.0}), (10.25, {"slm": 1.2, "llm": 5.0}), (10.5, {"slm": 1.2, "llm": 5.4})]
    spans = spans_from_reads(reads)
    assert spans["slm"] == [pytest.approx((10.05, 10.25))]
    # a step longer than the interval reaches back past the earlier read: counted whole
    assert spans["llm"] == [pytest.approx((10.1, 10.5))]


def test_the_first_read_is_the_baseline_and_a_model_seen_late_counts_from_zero():
    spans = spans_from_reads([(0.0, {"slm": 100.0}), (1.0, {"slm": 100.5, "llm": 0.25})])
    assert spans == {"slm": [pytest.approx((0.5, 1.0))], "llm": [pytest.approx((0.75, 1.0))]}
    assert spans_from_reads([(0.0, {"slm": 3.0})]) == {}


def test_busy_shares_of_a_window_add_up_to_the_counters_growth_inside_it():
    reads = [(t / 4, {"llm": 0.2 * t}) for t in range(41)]  # 80 % busy for 10 s
    spans = spans_from_reads(reads)
    window = Window(2.0, 8.0)
    share = sum(window.overlap(start, end) for start, end in spans["llm"]) / window.length
    assert share == pytest.approx(0.8)


def test_busy_seconds_are_read_per_model_label():
    samples = prometheus.parse('# HELP tokenrouter_busy_seconds_total Time spent in engine steps\n'
                               'tokenrouter_busy_seconds_total{model="slm"} 1.5\n'
                               'tokenrouter_busy_seconds_total{model="llm"} 4\n'
                               'tokenrouter_steps_total{model="llm"} 9\n')
    assert busy_by_model(samples) == {"slm": 1.5, "llm": 4.0}
