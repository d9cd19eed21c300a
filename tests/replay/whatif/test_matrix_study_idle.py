"""``matrix_study.step_errors``' "after idle" rows: a class's steps that came after the engine
waited (wall time no step's interval covers), shown alone as a subset of the class's row.

What these tests prove: on a run whose requests arrive one at a time to an idle engine, each
first step after a wait is counted in an "after idle" row, whose sums are part of the full
row's (a subset, never an extra), and a run with no wait has no such row."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.config import Config
from replay.whatif.cost.model import CostModel
from replay.whatif.matrix_study import IDLE_GAP_S, step_errors, step_errors_markdown
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload


def _run(spacing_s: float):
    requests = [replace(r, prompt=r.prompt[:200], max_tokens=8, arrival_s=spacing_s * i)
                for i, r in enumerate(reference_workload()[:6])]
    return record_workload(Config(num_kvcache_blocks=500), requests,
                           StepLaw(noise=0.0, flush_every=0))


def test_steps_after_a_wait_are_a_subset_row() -> None:
    """Six requests 0.5 s apart, each finished long before the next: the five later prefills
    each follow a wait, so "after idle" holds those five, within the full row's sums."""
    events = _run(0.5)
    report = step_errors(CostModel.fit(events), events)
    idle = {k: v for k, v in report["classes"].items() if k.endswith(", after idle")}
    assert sum(row["steps"] for row in idle.values()) == 5
    for key, row in idle.items():
        whole = report["classes"][key.removesuffix(", after idle")]
        assert row["steps"] <= whole["steps"]
        for what in ("device_s", "host_s", "interval_s"):
            assert row[what][0] <= whole[what][0] + 1e-12
            assert row[what][1] <= whole[what][1] + 1e-12
    assert report["idle_s"] > 5 * (0.5 - 0.1)
    assert ", after idle |" in step_errors_markdown({"cell": report})


def test_a_run_that_never_waits_has_no_after_idle_row() -> None:
    """All six at once: no step follows a wait of more than ``IDLE_GAP_S``."""
    events = _run(0.0)
    report = step_errors(CostModel.fit(events), events)
    assert not [k for k in report["classes"] if k.endswith(", after idle")]
    assert report["idle_s"] == pytest.approx(0.0, abs=IDLE_GAP_S)
