"""The live loop's host time to add a request (``replay.whatif.cost.arrivals``).

What these tests prove:
- the cost is measured where the source's engine stamped each request as it added it (the
  stamps of one step's batch lie one add apart): per request and per prompt token, recovered
  from a trace whose stamps follow a known law, both from ``request_added.added_s`` (schema 7,
  whatever the arrivals) and from an older trace's engine-stamped ``arrival_s``; a stall
  between two adds is left out; an older source whose stamps are the workload's own (all equal,
  or spread by the workload) measures nothing;
- the simulator charges it: a batch given one arrival time starts its first step after all its
  adds (every TTFT longer by the batch's add time), a batch whose stamps already hold the adds
  is not charged twice, a source whose first interval held the adds (its arrivals the
  workload's, its ``added_s`` the engine's) is predicted as recorded, not with the adds twice,
  and the decisions stay those of the run without the cost;
- the cost travels with a saved model.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.config import Config
from replay.recorded import RecordedEvents
from replay.verify import compare_decisions
from replay.whatif.cost.arrivals import AddCost, add_gaps, fit_add_cost
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.options import CostOptions
from replay.whatif.simulate import run_variant, workload_from_recorded, workload_from_requests
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.request import Request

CONFIG = Config(num_kvcache_blocks=400, max_num_seqs=64)
PER_REQUEST_S, PER_TOKEN_S = 12e-6, 40e-9


def batch(count: int = 48, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(rng.integers(0, 500, size=int(rng.integers(20, 400))).tolist(),
                    int(rng.integers(4, 24)), arrival_s=0.0) for _ in range(count)]


def add_law(lengths: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """The stamps of a batch added back to back, each add ``scale`` times ``PER_REQUEST_S`` +
    ``PER_TOKEN_S`` a prompt token after the one before."""
    each = scale * (PER_REQUEST_S + PER_TOKEN_S * lengths)
    return np.cumsum(each) - each[0]


def engine_stamped(events: RecordedEvents, column: str = "arrival_s",
                   scale: float = 1.0) -> RecordedEvents:
    """``events`` as if its engine had stamped each request when it added it (``add_law``), in
    ``column``: ``arrival_s`` as an older trace (no ``added_s``), or ``added_s`` (schema 7: the
    arrivals stay the workload's, and every step ends later by the batch's adds)."""
    added = events.tables["request_added"]
    lengths = np.asarray(added["prompt_len"], dtype=float)
    stamps = add_law(lengths, scale)
    added[column] = stamps
    if column == "arrival_s":
        added["added_s"] = np.full(len(stamps), np.nan)
    else:
        ms = events.tables["model_step"]
        last = stamps[-1] + scale * (PER_REQUEST_S + PER_TOKEN_S * lengths[-1])
        ms["wall_time_s"] = np.asarray(ms["wall_time_s"], dtype=float) + last
    return events


@pytest.fixture(scope="module")
def nominal() -> RecordedEvents:
    return record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0), seed=1)


@pytest.mark.parametrize("column", ["added_s", "arrival_s"])
def test_the_cost_of_an_add_is_recovered_from_engine_stamps(column: str) -> None:
    stamped = engine_stamped(record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0),
                                             seed=1), column)
    cost = fit_add_cost(stamped)
    assert cost.samples == len(batch()) - 1
    # A gap holds half of each of two adds: the law is recovered on the pair's mean length.
    assert cost.per_request_s == pytest.approx(PER_REQUEST_S, rel=0.2)
    assert cost.per_token_s == pytest.approx(PER_TOKEN_S, rel=0.1)


def test_a_stall_between_two_adds_is_not_an_add() -> None:
    stamped = engine_stamped(record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0),
                                             seed=1), "added_s")
    added = stamped.tables["request_added"]
    added["added_s"] = np.asarray(added["added_s"]) + np.where(np.arange(len(batch())) >= 20,
                                                               0.05, 0.0)  # a 50 ms pause
    cost = fit_add_cost(stamped)
    assert cost.samples == len(batch()) - 2
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
    assert CostModel.fit(stamped, options=CostOptions(request_add=False)).add == AddCost()
    without = replace(with_add, add=AddCost())  # the same step times, no charge for the adds
    target = workload_from_recorded(nominal)  # the batch at one arrival time: 0
    charged, free = (run_variant(target, {}, model) for model in (with_add, without))
    adds = sum(with_add.add.seconds(len(r.prompt)) for r in target.requests)
    assert charged.requests is not None and free.requests is not None
    assert (charged.requests["ttft_s"] - free.requests["ttft_s"]).tolist() == pytest.approx(
        [adds] * len(target.requests), rel=1e-6)
    assert charged.events is not None and free.events is not None
    assert compare_decisions(charged.events, free.events) is None


def test_a_first_interval_that_held_the_adds_is_not_charged_twice() -> None:
    stamped = engine_stamped(record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0),
                                             seed=1), "added_s", scale=10.0)
    model = CostModel.fit(stamped)
    assert model.add.samples == len(batch()) - 1
    unchanged = run_variant(workload_from_recorded(stamped), {}, model)
    recorded = float(np.asarray(stamped.tables["model_step"]["wall_time_s"])[-1])
    adds = sum(model.add.seconds(n) for n in stamped.tables["request_added"]["prompt_len"])
    assert adds > 0.02 * recorded  # large enough to show if counted twice
    assert unchanged.metrics["makespan_s"] == pytest.approx(recorded, rel=0.005)


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
    assert model.add.samples > 0
    workload = workload_from_requests(batch(), CONFIG, "w")
    charged = run_variant(workload, {}, model)
    free = run_variant(workload, {}, replace(model, add=AddCost()))
    adds = sum(model.add.seconds(len(r.prompt)) for r in workload.requests)
    assert charged.metrics["ttft_mean_s"] - free.metrics["ttft_mean_s"] == pytest.approx(
        adds, rel=1e-6)


def test_the_cost_travels_with_a_saved_model(tmp_path) -> None:
    stamped = engine_stamped(record_workload(CONFIG, batch(), StepLaw(noise=0.0, flush_every=0),
                                             seed=1))
    model = CostModel.fit(stamped)
    model.save(tmp_path / "m.json")
    assert CostModel.load(tmp_path / "m.json").add == model.add
