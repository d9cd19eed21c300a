"""The live loop's host time to add a request (``replay.whatif.cost.arrivals``).

What these tests prove:
- the cost is measured where the source's engine stamped each request as it added it (the
  stamps of one step's batch lie one add apart): per request and per prompt token, recovered
  from a trace whose stamps follow a known law; a source whose stamps are the workload's own
  (all equal, or spread by the workload) measures nothing;
- the simulator charges it: a batch given one arrival time starts its first step after all its
  adds (every TTFT longer by the batch's add time), a batch whose stamps already hold the adds
  is not charged twice, and the decisions stay those of the run without the cost;
- the cost travels with a saved model.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import Config
from replay.recorded import RecordedEvents
from replay.verify import compare_decisions
from replay.whatif.cost.arrivals import AddCost, add_gaps, fit_add_cost
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.profile import CostOptions
from replay.whatif.simulate import run_variant, workload_from_recorded, workload_from_requests
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.request import Request

CONFIG = Config(num_kvcache_blocks=400, max_num_seqs=64)
PER_REQUEST_S, PER_TOKEN_S = 12e-6, 40e-9


def batch(count: int = 48, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(rng.integers(0, 500, size=int(rng.integers(20, 400))).tolist(),
                    int(rng.integers(4, 24)), arrival_s=0.0) for _ in range(count)]


def engine_stamped(events: RecordedEvents) -> RecordedEvents:
    """``events`` as if its engine had stamped each request when it added it: each stamp one
    add (``PER_REQUEST_S`` + ``PER_TOKEN_S`` a prompt token) after the one before."""
    added = events.tables["request_added"]
    lengths = np.asarray(added["prompt_len"], dtype=float)
    added["arrival_s"] = np.cumsum(PER_REQUEST_S + PER_TOKEN_S * lengths) - (
        PER_REQUEST_S + PER_TOKEN_S * lengths[0])
    return events


@pytest.fixture(scope="module")
def nominal() -> RecordedEvents:
    return record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0), seed=1)


def test_the_cost_of_an_add_is_recovered_from_engine_stamps(nominal) -> None:
    stamped = engine_stamped(record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0),
                                             seed=1))
    cost = fit_add_cost(stamped)
    assert cost.samples == len(batch()) - 1
    # A gap holds half of each of two adds: the law is recovered on the pair's mean length.
    assert cost.per_request_s == pytest.approx(PER_REQUEST_S, rel=0.2)
    assert cost.per_token_s == pytest.approx(PER_TOKEN_S, rel=0.1)


def test_a_workloads_own_arrival_times_measure_nothing(nominal) -> None:
    assert fit_add_cost(nominal) == AddCost()  # one stamp for the whole batch
    spread = record_workload(CONFIG, [Request(r.prompt, r.max_tokens, arrival_s=0.002 * i)
                                      for i, r in enumerate(batch())],
                             StepLaw(noise=0.0, flush_every=0), seed=1)
    assert len(add_gaps(spread)[0]) == 0  # a workload's ms apart: not the engine's work


def test_a_batch_at_one_arrival_waits_for_its_adds_and_decides_the_same(nominal) -> None:
    stamped = engine_stamped(record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0),
                                             seed=1))
    with_add = CostModel.fit(stamped)
    without = CostModel.fit(stamped, options=CostOptions(request_add=False))
    assert without.add == AddCost()
    target = workload_from_recorded(nominal)  # the batch at one arrival time: 0
    charged, free = (run_variant(target, {}, model) for model in (with_add, without))
    adds = sum(with_add.add.seconds(len(r.prompt)) for r in target.requests)
    assert charged.requests is not None and free.requests is not None
    assert (charged.requests["ttft_s"] - free.requests["ttft_s"]).tolist() == pytest.approx(
        [adds] * len(target.requests), rel=1e-6)
    assert charged.events is not None and free.events is not None
    assert compare_decisions(charged.events, free.events) is None


def test_stamps_that_hold_the_adds_are_not_charged_twice() -> None:
    stamped = engine_stamped(record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0),
                                             seed=1))
    with_add = CostModel.fit(stamped)
    without = CostModel.fit(stamped, options=CostOptions(request_add=False))
    charged, free = (run_variant(workload_from_recorded(stamped), {}, model)
                     for model in (with_add, without))
    prompts = stamped.tables["request_added"]["prompt_token_ids"]
    adds = sum(with_add.add.seconds(len(prompt)) for prompt in prompts)
    # The first step starts about one add after the last stamp (the fitted law is not the
    # stamps' exactly), not a whole batch's adds later.
    later = charged.metrics["makespan_s"] - free.metrics["makespan_s"]
    assert 0 < later < 0.05 * adds


def test_workload_files_are_charged_as_they_are_fed() -> None:
    stamped = engine_stamped(record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0),
                                             seed=1))
    model = CostModel.fit(stamped)
    workload = workload_from_requests(batch(), CONFIG, "w")
    charged = run_variant(workload, {}, model)
    free = run_variant(workload, {}, CostModel.fit(stamped, options=CostOptions(
        request_add=False)))
    adds = sum(model.add.seconds(len(r.prompt)) for r in workload.requests)
    assert charged.metrics["ttft_mean_s"] - free.metrics["ttft_mean_s"] == pytest.approx(
        adds, rel=1e-6)


def test_the_cost_travels_with_a_saved_model(tmp_path) -> None:
    stamped = engine_stamped(record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0),
                                             seed=1))
    model = CostModel.fit(stamped)
    model.save(tmp_path / "m.json")
    assert CostModel.load(tmp_path / "m.json").add == model.add
