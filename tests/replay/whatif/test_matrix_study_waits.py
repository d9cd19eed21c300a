"""``matrix_study.request_waits``: a cell's TTFT split into the queue (arrival to first scheduled)
and the rest, recorded against predicted, so a TTFT error is placed in the wait for a step or
in the steps (``python -m benchmarks.matrix waits``).

What these tests prove: on a run whose steps follow one law, the model fitted on it predicts
both parts close to the recording, and the parts add up to the TTFT; a run whose requests
arrive while steps run has a queue part of its own; the Markdown names each part."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.config import Config
from replay.whatif.cost.model import CostModel
from replay.whatif.matrix_study import request_waits, request_waits_markdown
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload


@pytest.fixture(scope="module")
def events():
    requests = [replace(r, prompt=r.prompt[:300], max_tokens=min(r.max_tokens, 40),
                        arrival_s=0.02 * i) for i, r in enumerate(reference_workload()[:24])]
    return record_workload(Config(num_kvcache_blocks=2000, max_num_seqs=4), requests,
                           StepLaw(noise=0.0, flush_every=0))


def test_the_parts_add_up_and_a_model_of_the_run_predicts_them(events) -> None:
    waits = request_waits(CostModel.fit(events), events)
    for side in (0, 1):
        assert waits["queue mean"][side] + waits["after queue mean"][side] == pytest.approx(
            waits["ttft mean"][side])
    assert waits["queue mean"][0] > 0  # max_num_seqs 4 of 24 arrivals: requests wait
    for name in ("ttft p50", "queue p50", "ttft mean"):
        recorded, predicted = waits[name]
        assert abs(predicted - recorded) <= 0.15 * recorded, (name, waits[name])
    assert np.isfinite(waits["after queue p50"]).all()


def test_the_markdown_shows_recorded_and_predicted_per_part(events) -> None:
    text = request_waits_markdown({"cell": request_waits(CostModel.fit(events), events),
                                   "empty": {}})
    assert "queue p50 ms" in text and "→" in text
    assert "| empty | cannot run" in text


@pytest.fixture(scope="module")
def crowded():
    """Arrivals 1 ms apart, two 300-token prompts a step: requests wait through whole steps."""
    requests = [replace(r, prompt=r.prompt[:300], max_tokens=min(r.max_tokens, 40),
                        arrival_s=0.001 * i) for i, r in enumerate(reference_workload()[:24])]
    return record_workload(Config(num_kvcache_blocks=2000, max_num_batched_tokens=600,
                                  max_model_len=600), requests,
                           StepLaw(noise=0.0, flush_every=0))


def test_queued_steps_weigh_each_step_by_the_requests_waiting_through_it(crowded) -> None:
    """The queue's share of the step prices: the recorded steps' intervals (by hand here, as
    wall-time gaps), each times the requests left waiting when it was scheduled, summed; the
    same steps priced by a model of the run come close to it; a run where nobody waits through
    a step has none."""
    from replay.whatif.matrix_study import queued_steps

    waiting = dict(zip(crowded.tables["batch_scheduled"]["step"],
                       crowded.tables["batch_scheduled"]["num_waiting"]))
    steps = crowded.tables["model_step"]
    wall = np.asarray(steps["wall_time_s"], dtype=float)
    weights = np.array([waiting[s] for s in steps["step"]], dtype=float)
    assert weights.any() and not weights.all()  # some steps with requests waiting, some without
    recorded, predicted = queued_steps(CostModel.fit(crowded), crowded)["queued steps"]
    assert recorded == pytest.approx(float(np.dot(weights[1:], np.diff(wall))), rel=0.02)
    assert predicted == pytest.approx(recorded, rel=0.1)
    text = request_waits_markdown({"cell": request_waits(CostModel.fit(crowded), crowded)})
    assert "queued steps s" in text and text.count("→") == 7


def test_a_run_nobody_waits_through_has_no_queued_steps(events) -> None:
    """Requests 20 ms apart: each is admitted at the next step."""
    waits = request_waits(CostModel.fit(events), events)
    assert waits["queued steps"] == [0.0, 0.0]
    assert request_waits_markdown({"cell": waits}).rstrip("\n").endswith("| none |")
