"""The step-time model with a device profile: steps the source never ran priced from the profile
(scaled to the source), attribution of every step, and each mechanism switchable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from _cost_helpers import predicted_intervals

from engine.config import Config
from replay.whatif.cost.features import feature_matrix
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.options import CostOptions
from replay.whatif.cost.profile import OUTSIDE, PROFILE, TRACE
from replay.whatif.synthetic import StepLaw, law_profile, record_workload
from replay.workloads.builtin import reference_workload

LAW = StepLaw(noise=0.0, flush_every=0)
SOURCE = Config(num_kvcache_blocks=2000, max_num_seqs=64)
CHUNKED = {"policy": "chunked", "max_num_batched_tokens": 512}
DEVICE = Config(max_model_len=4096, max_num_seqs=512, max_num_batched_tokens=32768,
                num_kvcache_blocks=60000)


@pytest.fixture(scope="module")
def runs() -> tuple:
    requests = reference_workload()[:64]
    return (record_workload(SOURCE, requests, LAW),
            record_workload(SOURCE.replace(**CHUNKED), requests, LAW))


def _law_times(events) -> np.ndarray:
    return np.asarray(events.tables["model_step"]["duration_s"], dtype=float)


@pytest.mark.parametrize(("mode", "said"), [("pooled", "pooled with the profile"),
                                           ("blend", "priced by the source's fits")])
def test_mixed_steps_the_source_never_ran_are_priced_by_the_profile(runs, mode: str,
                                                                    said: str) -> None:
    """The source has no mixed step; the chunked target's mixed steps are priced from the
    profile's rows (pooled: one fit of the source's steps and the profile's; blend: the
    profile's own fit), within 3% of the law; the source's own classes lie within its range,
    and the warnings say so."""
    source, target = runs
    model = CostModel.fit(source, profile=law_profile(DEVICE, LAW),
                          options=CostOptions(profile_mode=mode))
    x, classes = feature_matrix(target)
    mixed = classes == "mixed"
    assert mixed.sum() > 10 and "mixed" not in set(feature_matrix(source)[1])
    predicted = predicted_intervals(model, x, classes)
    error = np.abs(predicted[mixed] / _law_times(target)[mixed] - 1)
    assert float(np.median(error)) < 0.03
    pricing = model.prior.pricing(x, classes)
    assert pricing["mixed"][PROFILE] == mixed.sum()
    assert pricing["decode_graph"][TRACE] > 0
    assert any(said in line for line in model.coverage_warnings(target))


@pytest.mark.parametrize("mode", ["pooled", "blend"])
def test_a_profile_of_a_slower_device_is_scaled_to_the_source(runs, mode: str) -> None:
    """A profile whose steps take 1.8 times the law's (inside the 0.5..2 bounds a scale is
    taken within): scaled by the source's own steps (x 1/1.8: its profile rows when pooled, its
    fits in blend), it prices the mixed steps, which the source never ran, as the law does;
    unscaled, 1.8 times too slow."""
    source, target = runs
    slow = StepLaw(**{k: 1.8 * v if k.endswith("_s") else v
                      for k, v in vars(LAW).items()})
    profile = law_profile(DEVICE, slow)
    x, classes = feature_matrix(target)
    mixed = classes == "mixed"
    truth = _law_times(target)[mixed]
    scaled = CostModel.fit(source, profile=profile, options=CostOptions(profile_mode=mode))
    assert scaled.prior.scale and all(0.53 < s < 0.58 for s in scaled.prior.scale.values())
    assert np.median(predicted_intervals(scaled, x, classes)[mixed] / truth) == pytest.approx(
        1.0, abs=0.03)
    unscaled = CostModel.fit(source, profile=profile,
                             options=CostOptions(profile_mode=mode, profile_scale=False))
    assert np.median(predicted_intervals(unscaled, x, classes)[mixed] / truth) > 1.6


def test_steps_outside_both_ranges_are_said_so(runs) -> None:
    """A profile of a small device covers no large decode: those steps are outside both."""
    source, _ = runs
    small = Config(max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512,
                   num_kvcache_blocks=400)
    model = CostModel.fit(source, profile=law_profile(small, LAW),
                          options=CostOptions(profile_mode="profile"))
    x, classes = feature_matrix(source)
    big = (classes == "decode_graph") & (x[:, 0] > 8)
    assert big.any()
    assert model.prior.priced_by("decode_graph", x[big][0].tolist()) == OUTSIDE
    assert any("outside both" in line for line in model.prior.warnings(x, classes))


def test_every_switch_fits_and_the_defaults_are_the_model_without_options(runs, tmp_path: Path
                                                                          ) -> None:
    """All mechanisms off still prices every step; CostOptions() is the plain fit; a model
    with a prior survives save and load."""
    source, target = runs
    plain = CostModel.fit(source)
    assert plain.to_dict() == CostModel.fit(source, options=CostOptions()).to_dict()
    off = CostOptions.parse(["warmup_steps=off", "warmup_window=off", "calibration=off",
                             "overlap=off", "class_offsets=off", "request_add=off",
                             "prefill_roofline=off"])
    assert off.changed() and CostModel.fit(source, options=off).options == off.changed()
    for mode in ("blend", "pooled", "profile"):
        model = CostModel.fit(source, profile=law_profile(DEVICE, LAW),
                              options=replace(off, profile_mode=mode))
        x, classes = feature_matrix(target)
        assert (predicted_intervals(model, x, classes) > 0).all()
        model.save(tmp_path / f"{mode}.json")
        loaded = CostModel.load(tmp_path / f"{mode}.json")
        assert np.allclose(predicted_intervals(loaded, x, classes),
                           predicted_intervals(model, x, classes))
    with pytest.raises(ValueError, match="expected on or off"):
        CostOptions.parse(["overlap=maybe"])
    with pytest.raises(ValueError, match="NAME=VALUE"):
        CostOptions.parse(["nonsense=on"])


class _Unit:
    """A profile fit that predicts one second for every step."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.ones(len(x))


def test_a_class_of_few_source_steps_takes_the_scale_of_all_steps() -> None:
    """``_class_scales``: a class with ``MIN_SCALE_STEPS`` source steps gets its own median
    ratio; one with fewer (a handful of host-bound eager steps) and one the source never ran
    take the median over every qualifying step, not a median of class ratios the few could
    sway; a ratio outside the bounds is not taken."""
    from replay.whatif.cost.features import Steps
    from replay.whatif.cost.profile import MIN_SCALE_STEPS, _class_scales

    many, few = 40, MIN_SCALE_STEPS - 1
    classes = np.array(["decode_graph"] * many + ["prefill_graph"] * MIN_SCALE_STEPS
                       + ["prefill"] * few)
    time = np.concatenate([np.full(many, 1.02), np.full(MIN_SCALE_STEPS, 1.10),
                           np.full(few, 1.90)])
    n = len(classes)
    steps = Steps(np.zeros((n, 1)), classes, time, np.full(n, np.nan), time,
                  np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool))
    fits = {c: _Unit() for c in ("decode_graph", "prefill_graph", "prefill", "mixed")}
    scale, overall = _class_scales(fits, steps, True)  # type: ignore[arg-type]
    assert scale == pytest.approx({"decode_graph": 1.02, "prefill_graph": 1.10})
    assert overall == pytest.approx(1.02)  # 40 of the 48 qualifying steps
    assert _class_scales(fits, steps, False) == ({}, 1.0)
    steps.time[:] = 3.0  # beyond SCALE_BOUNDS: no scale at all
    assert _class_scales(fits, steps, True) == ({}, 1.0)


def test_a_classs_run_steps_weigh_as_much_as_its_calibration_and_profile_rows() -> None:
    """``weigh_run``: a class of 3 run steps beside 40 calibration and profile rows is repeated
    13 times (40 // 3), so a least-squares level over both lands halfway between them instead
    of at the many rows' level; a class whose run steps outnumber the others is left as it is;
    ``cap`` bounds the repeats."""
    from replay.whatif.cost.features import Steps
    from replay.whatif.cost.fit import weigh_run

    def steps(classes: list[str], time: float) -> Steps:
        n = len(classes)
        return Steps(np.zeros((n, 1)), np.array(classes), np.full(n, time),
                     np.full(n, np.nan), np.full(n, time), np.zeros(n, bool),
                     np.zeros(n, bool), np.zeros(n, bool))

    run = steps(["prefill_graph"] * 3 + ["decode_graph"] * 100, 2.0)
    others = steps(["prefill_graph"] * 40 + ["decode_graph"] * 10, 1.0)
    weighed = weigh_run(run, others)
    assert (weighed.classes == "prefill_graph").sum() == 39
    assert (weighed.classes == "decode_graph").sum() == 100
    pooled = weighed.concat(others)
    prefill = pooled.time[pooled.classes == "prefill_graph"]
    assert prefill.mean() == pytest.approx((39 * 2.0 + 40 * 1.0) / 79)  # ~1.49, not ~1.07
    assert (weigh_run(run, others, cap=4).classes == "prefill_graph").sum() == 12


def test_under_a_pooled_profile_the_sources_leading_prefills_are_fitted() -> None:
    """The reference's nine 16k-token prefills all come before its first decode, so without a
    profile they fall in the warm-up window (left out of the fits); with a pooled profile they
    stay in, weighted as much as the start-up's and the profile's rows together, and the
    model prices the source's own prefill steps within 3% (they were -6%: BENCHMARKS 7q)."""
    from replay.recorded import from_trace
    from replay.whatif.cost.model import CostModel
    from replay.whatif.matrix_study import step_errors
    from tracing.reader import read_trace

    source = "traces/matrix-s18/reference-default-3"
    events = from_trace(read_trace(source))
    assert CostModel.fit(events).window_steps >= 9
    model = CostModel.fit(events, profile="traces/profiles/h200-qwen3-0.6b-s18.profile.json")
    assert model.window_steps == 0
    recorded, predicted = step_errors(model, events)["classes"]["prefill_graph sequential"][
        "device_s"]
    assert abs(predicted / recorded - 1) <= 0.03, (recorded, predicted)
