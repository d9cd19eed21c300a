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
