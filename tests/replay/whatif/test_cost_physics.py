"""The step-time model's physical pieces: the engine's host work that a timed executor call
lacks, graph or eager taken from the step itself, and the matrix studies (per-class step
errors, the ablation's summary)."""

from __future__ import annotations

import numpy as np
import pytest

from replay.whatif.cost.features import FEATURES, LinearFit, Steps, class_fit, step_class
from replay.whatif.cost.overlap import engine_host_s
from replay.whatif.cost.profile import CostOptions
from replay.whatif.matrix_study import (
    OPT_IN,
    SWITCHES,
    ablation_markdown,
    ablation_summary,
    ablation_variants,
)


def _steps(classes: list[str], seqs: list[float], host: list[float]) -> Steps:
    n = len(classes)
    x = np.zeros((n, len(FEATURES)))
    x[:, FEATURES.index("num_seqs")] = seqs
    no = np.zeros(n, dtype=bool)
    return Steps(x=x, classes=np.array(classes), time=np.full(n, 1e-3), host=np.array(host),
                 interval=np.full(n, 2e-3), overlapped=no, is_calibration=no, window=no.copy())


def test_engine_host_work_is_what_real_steps_take_beyond_their_calibration_steps() -> None:
    """Calibration decodes take 0.3 ms + 1 us per sequence on the host; the run's decodes take
    0.4 ms more at every size: that 0.4 ms is the engine's own work per step."""
    seqs = [1.0, 16.0, 64.0]
    calibration = _steps(["decode_graph"] * 3, seqs, [3e-4 + 1e-6 * s for s in seqs])
    run_seqs = list(np.linspace(1, 200, 40))
    run = _steps(["decode_graph"] * 40, run_seqs, [7e-4 + 1e-6 * s for s in run_seqs])
    assert engine_host_s(run, calibration) == pytest.approx(4e-4, rel=1e-6)
    # No class with both real and calibration steps: nothing to measure it by.
    assert engine_host_s(run, _steps(["prefill_graph"] * 3, seqs, [3e-4] * 3)) == 0.0


def test_a_mixed_step_from_a_cuda_graph_is_its_own_class_and_never_has_the_eager_floor() -> None:
    """Graph or eager comes from the step: a graph mixed step is ``mixed_graph``, priced by the
    graph prefill fit where there is one, by the eager mixed fit's floor-free form otherwise."""
    assert step_class("mixed", True) == "mixed_graph"
    assert step_class("mixed", False) == "mixed"
    zero = (0.0,) * len(FEATURES)
    graph_prefill = LinearFit(1e-3, zero, (), 10)
    prefill = LinearFit(2e-3, zero, (), 10, floor=0.01)
    assert class_fit({"prefill_graph": graph_prefill, "prefill": prefill},
                     "mixed_graph") is graph_prefill
    assert class_fit({"prefill": prefill}, "mixed_graph").intercept == prefill.intercept


def test_the_ablation_switches_each_mechanism_off_once_and_sums_misses() -> None:
    variants = ablation_variants(CostOptions(profile_mode="profile"), with_profile=True)
    assert set(variants) == {"all mechanisms", "no profile", "profile_mode=blend",
                             "profile_mode=pooled", *(f"{s}=off" for s in SWITCHES),
                             *(f"{s}=on" for s in OPT_IN)}
    assert variants["shared_kv=on"].shared_kv and not variants["all mechanisms"].shared_kv
    assert variants["no profile"] is None
    assert not variants["overlap=off"].overlap and variants["overlap=off"].engine_host
    targets = {"makespan_s": 0.03, "ttft_mean_s": 0.10}
    rows = [{"kind": "prediction", "status": "ok", "makespan_s": 0.05, "ttft_mean_s": -0.02},
            {"kind": "prediction", "status": "ok", "makespan_s": -0.01, "ttft_mean_s": 0.2},
            {"kind": "spread", "status": "ok", "makespan_s": 0.5, "ttft_mean_s": 0.5}]
    summary = ablation_summary(rows, targets)
    assert summary["cells"] == 2 and summary["misses"] == 2
    assert summary["makespan_s"] == pytest.approx(0.03)
    assert "| x | 3.0% | 11.0% | 2 of 4 |" in ablation_markdown({"x": summary}, targets)


def test_step_errors_price_a_recording_by_the_model_fitted_on_it() -> None:
    """A law-timed recording priced step by step by its own model: per class the recorded and
    predicted sums agree to a few percent, and no step is a stall."""
    from engine.config import Config
    from replay.whatif.cost.model import CostModel
    from replay.whatif.matrix_study import step_errors, step_errors_markdown
    from replay.whatif.synthetic import HostLaw, StepLaw, record_workload
    from replay.workloads.builtin import reference_workload

    config = Config(num_kvcache_blocks=2000, max_num_seqs=32)
    events = record_workload(config, reference_workload()[:32], StepLaw(noise=0.01),
                             host=HostLaw())
    report = step_errors(CostModel.fit(events), events)
    assert report["classes"] and report["idle_s"] == pytest.approx(0.0, abs=1e-6)
    for row in report["classes"].values():
        recorded, predicted = row["interval_s"]
        assert row["stalls"] == 0 and predicted == pytest.approx(recorded, rel=0.05)
    assert "idle between steps" in step_errors_markdown({"cell": report})


def test_repeated_recordings_of_a_cell_are_named_so_that_the_matrix_states_their_spread() -> None:
    """``--repeat 3`` names CELL, CELL-r2, CELL-r3; ``spread_row`` labels them all."""
    import sys
    from pathlib import Path

    from replay.whatif.fidelity import spread_row

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from benchmarks.matrix import recording_names

    names = recording_names("chat-chunked-512", 3)
    assert names == ["chat-chunked-512", "chat-chunked-512-r2", "chat-chunked-512-r3"]
    summary = {"makespan_s": 10.0, "throughput_tok_s": 100.0, "ttft_mean_s": 1.0,
               "ttft_p50_s": 1.0, "ttft_p99_s": 2.0, "tpot_mean_s": 0.01, "tpot_p50_s": 0.01,
               "tpot_p99_s": 0.02}
    row = spread_row([summary, {**summary, "makespan_s": 10.5}, summary], names)
    assert row["target"] == " / ".join(names) and row["makespan_s"] == pytest.approx(0.05)
