"""``matrix_study.host_drift``: a run cut into spans of wall time, the host's speed in each (the
median host time of its CUDA-graph decodes and eager steps) and the eager steps' recorded and
predicted device time.

What these tests prove:
- every decode and eager step of the run is counted in exactly one span;
- on a run whose host keeps one speed, the model fitted on it prices each span's eager steps
  to within a few per cent, and the host medians stay put;
- where the host slows down mid-run (its host times doubled from half-way, the eager steps'
  device time x1.5, as an eager step's timer holds its input building and launches), the later
  spans show both: host medians x2, eager device recorded over predicted x1.5.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest

from engine.config import Config
from replay.whatif.cost import features
from replay.whatif.cost.model import CostModel
from replay.whatif.matrix_study import host_drift, host_drift_markdown
from replay.whatif.synthetic import HostLaw, StepLaw, record_workload
from replay.workloads.builtin import reference_workload


@pytest.fixture(scope="module")
def trace():
    """Requests arriving every 0.25 s, so that eager prefills come all through the run."""
    requests = [replace(r, arrival_s=0.25 * i) for i, r in enumerate(reference_workload()[:40])]
    return record_workload(Config(num_kvcache_blocks=2000, max_num_seqs=8), requests,
                           StepLaw(noise=0.0, flush_every=0), host=HostLaw(launch_s=4e-3))


def _slowed(events, host_factor: float, device_factor: float):
    """``events`` with every step ending in the second half of the run slowed: host times x
    ``host_factor``, eager steps' device time x ``device_factor`` (a copy)."""
    events = copy.deepcopy(events)
    ms = events.tables["model_step"]
    wall = np.asarray(ms["wall_time_s"], dtype=float)
    late = wall > (wall.min() + wall.max()) / 2
    kinds = features.step_class(np.asarray(ms["kind"]).astype(str),
                                np.asarray(ms["graph_used"], dtype=bool))
    eager = np.isin(kinds, list(features.EAGER_CLASSES))
    ms["host_s"] = np.where(late, host_factor, 1.0) * np.asarray(ms["host_s"], dtype=float)
    ms["duration_s"] = np.where(late & eager, device_factor, 1.0) * np.asarray(
        ms["duration_s"], dtype=float)
    return events


def _ratio(row) -> float:
    recorded, predicted = row["eager_device_s"]
    return recorded / predicted


def test_every_step_is_in_one_span_and_a_steady_host_is_priced_per_span(trace) -> None:
    model = CostModel.fit(trace)
    rows = host_drift(model, trace, windows=6)
    ms = trace.tables["model_step"]
    kinds = features.step_class(np.asarray(ms["kind"]).astype(str),
                                np.asarray(ms["graph_used"], dtype=bool))
    assert sum(r["decode_steps"] for r in rows) == int((kinds == "decode_graph").sum())
    assert sum(r["eager_steps"] for r in rows) == int(
        np.isin(kinds, list(features.EAGER_CLASSES)).sum()) > 0
    with_eager = [r for r in rows if r["eager_steps"]]
    assert len(with_eager) >= 2
    for row in with_eager:
        assert _ratio(row) == pytest.approx(1.0, abs=0.05)
    hosts = [r["eager_host_s"] for r in with_eager]
    assert max(hosts) / min(hosts) < 1.2
    table = host_drift_markdown({"cell": rows})
    assert table.count("\n") == len(rows) + 1 and "| cell |" in table


def test_a_host_slowing_mid_run_shows_in_the_later_spans(trace) -> None:
    model = CostModel.fit(trace)  # priced at the run's first host speed
    steady = host_drift(model, trace, windows=2)
    slowed = host_drift(model, _slowed(trace, 2.0, 1.5), windows=2)
    first, last = slowed[0], slowed[-1]
    assert first["eager_host_s"] == pytest.approx(steady[0]["eager_host_s"])
    assert last["eager_host_s"] == pytest.approx(2.0 * steady[-1]["eager_host_s"])
    assert last["decode_host_s"] == pytest.approx(2.0 * steady[-1]["decode_host_s"])
    assert _ratio(first) == pytest.approx(_ratio(steady[0]))
    assert _ratio(last) == pytest.approx(1.5 * _ratio(steady[-1]))
