"""``replay.whatif.tune``: SLO parsing, successive-halving rungs, the Pareto front, and a search
on the committed H200 reference trace.

What these tests prove: a bad ``--slo`` names the metrics accepted; successive halving runs
every valid configuration on a small subset and fewer on more requests, ending on the whole
workload; the front keeps exactly the non-dominated runs (one of equal ones); and on
traces/h200-reference-s4 the search finds a configuration meeting ``ttft_p99 <= 0.5 s`` and
``tpot_p50 <= 5.5 ms`` that the recorded defaults (TPOT p50 6.0 ms) miss.
"""

from __future__ import annotations

import math

import pytest

from engine.config import Config
from replay.whatif.simulate import OK, SimResult, SimWorkload, load_source, load_timing
from replay.whatif.tune import (
    MIN_SUBSET,
    Evaluation,
    Slo,
    TuneError,
    TuneResult,
    parse_slo,
    rung_sizes,
    tune,
)

REFERENCE = "traces/h200-reference-s4"
SLOS = [Slo("ttft_p99", 0.5), Slo("tpot_p50", 0.0055)]


def test_parse_slo_reads_metric_and_seconds_and_rejects_bad_input():
    assert parse_slo("ttft_p99=0.5") == Slo("ttft_p99", 0.5)
    assert parse_slo(" tpot_mean = 0.02").key == "tpot_mean_s"
    # inf and 1e400 bounded nothing: every configuration "met" them (was accepted)
    for bad in ("ttft=0.5", "ttft_p99", "ttft_p99=fast", "ttft_p99=0", "throughput=1",
                "ttft_p99=inf", "e2e_p50=1e400", "ttft_p99=nan"):
        with pytest.raises(TuneError, match="--slo"):
            parse_slo(bad)


def test_rung_sizes_shrink_by_eta_down_to_the_budget_but_not_below_min_subset():
    assert rung_sizes(10, 1000, budget=16, eta=3) == [1000]
    assert rung_sizes(100, 900, budget=16, eta=3) == [100, 300, 900]  # 100 -> 34 -> 12
    assert rung_sizes(10_000, 3 * MIN_SUBSET, budget=1, eta=3) == [MIN_SUBSET, 3 * MIN_SUBSET]


def _fake(metrics: dict[str, float], overrides: dict | None = None) -> Evaluation:
    result = SimResult("x", overrides or {}, OK, True, {"requests": 10.0, "rejected": 0.0,
                                                        **metrics})
    return Evaluation(overrides or {}, result, 10, tuple(SLOS[:1]))


def test_pareto_front_keeps_non_dominated_runs_once():
    fast = _fake({"makespan_s": 1.0, "ttft_p99_s": 0.9}, {"a": 1})
    slow_good = _fake({"makespan_s": 2.0, "ttft_p99_s": 0.1}, {"a": 2})
    dominated = _fake({"makespan_s": 2.0, "ttft_p99_s": 0.5}, {"a": 3})
    twin = _fake({"makespan_s": 2.0, "ttft_p99_s": 0.1}, {"a": 4})
    result = TuneResult(tuple(SLOS[:1]), [fast, slow_good, dominated, twin], fast, Config())
    assert result.pareto_front() == [fast, slow_good]
    assert result.best is slow_good  # the only one meeting ttft_p99 <= 0.5
    assert math.isclose(slow_good.goodput_req_s, 5.0) and fast.goodput_req_s == 0.0


def test_successive_halving_narrows_on_subsets_and_ends_on_the_whole_workload():
    """A stub simulator whose goodput grows with max_num_seqs: the largest must win."""
    workload = SimWorkload("stub", Config(num_kvcache_blocks=100), {},
                           requests=[object()] * 810)  # type: ignore[list-item]
    calls: list[tuple[int, int]] = []

    def run(w, variants):
        calls.append((len(w.requests), len(variants)))
        return [SimResult(n, o, OK, True, {"requests": float(len(w.requests)), "rejected": 0.0,
                                           "makespan_s": 100.0 / o.get("max_num_seqs", 1),
                                           "ttft_p99_s": 0.1})
                for n, o in variants]

    space = {"max_num_seqs": list(range(1, 28))}
    result = tune(workload, SLOS[:1], space, run, budget=3, eta=3)
    assert calls == [(90, 27), (270, 9), (810, 3), (810, 1)]  # the last: the source
    assert result.best is not None and result.best.overrides == {"max_num_seqs": 27}
    assert result.set_lines() == ["--set max_num_seqs=27"]


@pytest.mark.slow
def test_tune_on_the_h200_reference_trace_meets_an_slo_the_defaults_miss():
    workload = load_source(REFERENCE)
    cost, _ = load_timing("auto", workload)
    from replay.whatif.executors import variant_runner

    space = {"max_num_seqs": [128, 256]}
    result = tune(workload, SLOS, space, variant_runner("process", cost, jobs=2))
    assert not result.baseline.meets
    assert result.baseline.result.metrics["tpot_p50_s"] > 0.0055
    best = result.best
    assert best is not None and best.meets and best.overrides == {"max_num_seqs": 128}
    assert best.result.metrics["ttft_p99_s"] <= 0.5
    assert best.result.metrics["tpot_p50_s"] <= 0.0055
