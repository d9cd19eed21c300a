"""Session 31 (what-if grids): defects found probing ``whatif`` and ``tune`` as a user would.

What these tests prove: ``tune --budget 1`` runs at most one configuration on the whole workload
(it ran 56 of 168 on traces/h200-reference); the best configuration printed is a row of the
printed Pareto front (of runs with equal results the front showed another one, so ``best:``
named a configuration the table did not list); where nothing meets the SLOs the output names
the closest run and what it misses; a workload too small to narrow says it ran over budget; a
device override is noted as not simulated; and a trace recorded with a user policy whose module
is absent fails with one line naming the policy and PYTHONPATH, not "the config is invalid".
"""

from __future__ import annotations

import pytest

from engine.config import Config
from engine.errors import ReplayLLMError
from replay.whatif import tune_report
from replay.whatif.notes import variant_notes
from replay.whatif.simulate import OK, SimResult, SimWorkload
from replay.whatif.tune import Slo, TuneResult, tune
from replay.whatif.tune_report import describe_search, rows

SLO = Slo("ttft_p99", 0.5)


def _stub(num_requests: int, calls: list, ttft: float = 0.1, ties: bool = False):
    workload = SimWorkload("stub", Config(num_kvcache_blocks=100, max_num_seqs=512), {},
                           requests=[object()] * num_requests)  # type: ignore[list-item]

    def run(w, variants):
        calls.append((len(w.requests), len(variants)))
        # ties: every max_num_seqs >= 256 behaves alike (the workload never has more running)
        return [SimResult(n, o, OK, True, {
            "requests": float(len(w.requests)), "rejected": 0.0, "ttft_p99_s": ttft,
            "makespan_s": 100.0 / (min(o.get("max_num_seqs", 512), 256) if ties
                                   else o.get("max_num_seqs", 1))}) for n, o in variants]

    return workload, run


def test_budget_one_runs_one_configuration_on_the_whole_workload():
    calls: list = []
    workload, run = _stub(256, calls)
    result = tune(workload, [SLO], {"max_num_seqs": list(range(1, 169))}, run, budget=1, eta=3)
    assert calls[-2] == (256, 1)  # was (256, 56): 168 -> 56 and no further cut
    assert len(result.evaluations) == 1 and result.best is not None
    assert result.best.overrides == {"max_num_seqs": 168}


def test_a_workload_too_small_to_narrow_says_it_ran_over_budget():
    calls: list = []
    workload, run = _stub(40, calls)
    result = tune(workload, [SLO], {"max_num_seqs": list(range(1, 9))}, run, budget=2, eta=3)
    assert calls[0] == (40, 8)
    assert "over --budget 2" in describe_search(result)


def test_best_is_a_row_of_the_printed_front_among_equal_runs():
    calls: list = []
    workload, run = _stub(64, calls, ties=True)
    result = tune(workload, [SLO], {"max_num_seqs": [256, 512]}, run, budget=16)
    best = result.best
    assert best is not None and best.overrides == {"max_num_seqs": 512}  # the source's own
    front = [r["configuration"] for r in rows(result)[1:] if r["pareto"]]
    assert front == [best.name]  # was ["max_num_seqs=256"]: best not in the table


def test_nothing_meeting_names_the_closest_run_and_what_it_misses():
    calls: list = []
    workload, run = _stub(64, calls, ttft=2.0)
    result = tune(workload, [SLO], {"max_num_seqs": [64, 128]}, run)
    assert isinstance(result, TuneResult) and result.best is None
    (line,) = tune_report.verdict(result)
    # Every run misses alike: the source's own, the fewest changes, stands for them (session
    # 32: closest picks among the searched runs and the source's, as best does).
    assert line.startswith("closest: as recorded misses ttft_p99")
    assert "2000.00 ms > 500 ms" in line


def test_a_device_override_is_noted_as_not_simulated():
    from types import SimpleNamespace

    executor = SimpleNamespace(synthesized=0, overlapped_steps=0, steps=10)
    notes = variant_notes(Config(device="auto"), Config(device="cpu"), None, executor)
    assert any(n.startswith("device: not simulated") for n in notes)


def test_a_user_policy_trace_without_its_module_names_the_policy(tmp_path):
    from replay.recorded import from_trace
    from replay.whatif.source import workload_from_recorded
    from tracing.reader import read_trace

    events = from_trace(read_trace("traces/cpu-tiny-demo"))
    events.header["config"] = {**events.header["config"], "policy": "nomodule31.x:Policy"}
    with pytest.raises(ReplayLLMError, match="user policy nomodule31.x:Policy.*PYTHONPATH"):
        workload_from_recorded(events, "demo")
