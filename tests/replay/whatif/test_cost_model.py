"""The step-time model: per-class fits chosen by held-out error, with their error on held-out steps.

What these tests prove: a noise-free linear step law is recovered exactly (held-out error ~0,
the per-context-token cost to 1e-6); with noise the held-out error is honest (about the noise,
not 0); idle gaps waiting for arrivals are not counted as step time; slopes and intercepts are
never negative; CUDA-graph padding is learned from the trace; a mixed (chunked) step is predicted
from prefill and decode fits when the source had none; a trace without timings is refused with a
clear message; save/load round-trips (and refuses another version's file).
Physics: an eager launch floor, max(floor, linear), is recovered and chosen over a plain linear
fit by held-out error; decode features are chosen by how they extrapolate to larger batches; a
source that cannot identify what a target needs (no step on the launch floor, batches far
beyond its own) makes the model warn; the simulator's per-step prediction applies the floors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from _cost_helpers import CausalLaw

from engine.batch import ScheduledBatch
from engine.config import Config
from engine.graph_sizes import padded_decode_size
from replay.metrics import compute
from replay.whatif.cost.features import FEATURES, feature_matrix, step_intervals
from replay.whatif.cost.fit import fit_linear, select
from replay.whatif.cost.model import MODEL_VERSION, CostModel, CostModelError
from replay.whatif.simulate import simulate
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request

NOISE_FREE = CausalLaw(noise=0.0, flush_every=0)
CONFIG = Config(num_kvcache_blocks=600)


def staggered_requests(count: int = 120, gap_s: float = 0.03, seed: int = 0) -> list[Request]:
    """Requests arriving one by one: many prefill steps of different sizes, and decodes."""
    rng = np.random.default_rng(seed)
    return [
        Request(rng.integers(0, 9000, size=int(rng.integers(20, 600))).tolist(),
                int(rng.integers(20, 200)), arrival_s=gap_s * i)
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def noise_free_trace():
    return record_workload(CONFIG, staggered_requests(), NOISE_FREE)


def test_a_noise_free_linear_law_is_recovered(noise_free_trace) -> None:
    model = CostModel.fit(noise_free_trace)
    assert set(model.fits) >= {"prefill", "decode_graph"}
    for name in ("prefill", "decode_graph", "all"):
        assert model.heldout[name]["mape_pct"] < 0.01, (name, model.heldout[name])
    ctx = model.fits["decode_graph"].coef[FEATURES.index("decode_kv_tokens")]
    assert ctx == pytest.approx(NOISE_FREE.per_context_token_s, rel=1e-6)


def test_heldout_error_reflects_the_noise_it_did_not_see() -> None:
    noise = 0.05
    trace = record_workload(CONFIG, staggered_requests(), StepLaw(noise=noise, flush_every=0))
    mape = CostModel.fit(trace).heldout["decode_graph"]["mape_pct"]
    # The mean absolute value of lognormal noise of sigma 5% is about 4%.
    assert 2.0 < mape < 6.0


def test_idle_gaps_waiting_for_arrivals_are_not_step_time() -> None:
    late_s = 50.0
    requests = [
        Request(r.prompt, r.max_tokens, arrival_s=0.0 if i < 4 else late_s)
        for i, r in enumerate(staggered_requests(count=8))
    ]
    trace = record_workload(CONFIG, requests, NOISE_FREE)
    durations = np.asarray(trace.tables["model_step"]["duration_s"])
    wall = np.asarray(trace.tables["model_step"]["wall_time_s"])
    assert np.diff(wall).max() > late_s / 2  # the engine did sit idle
    # The law's clock has no overhead between steps: a step's interval is its duration.
    assert step_intervals(trace) == pytest.approx(durations, rel=1e-9)


def test_slopes_are_never_negative() -> None:
    rng = np.random.default_rng(0)
    x = np.zeros((200, len(FEATURES)))
    x[:, FEATURES.index("decode_seqs")] = rng.integers(1, 256, 200)
    x[:, FEATURES.index("decode_context_tokens")] = rng.integers(1000, 100000, 200)
    # Time falls with context tokens here (impossible physically): that slope must go, not < 0.
    y = 1e-3 + 2e-5 * x[:, 3] - 1e-9 * x[:, 4] + rng.normal(0, 1e-5, 200)
    fit = fit_linear(x, y, ("decode_seqs", "decode_context_tokens"))
    assert min(fit.coef) >= 0.0
    assert fit.features == ("decode_seqs",)


def test_cuda_graph_padding_is_learned_from_the_trace(noise_free_trace) -> None:
    sizes = CostModel.fit(noise_free_trace).graph_sizes
    assert padded_decode_size(sizes, 1) == 1 and padded_decode_size(sizes, 3) == 4
    assert padded_decode_size(sizes, 17) == 32 and padded_decode_size(sizes, 512) == 512
    assert padded_decode_size(sizes, 513) == 0  # larger than any graph: eager


def test_mixed_steps_are_predicted_from_prefill_and_decode_fits(noise_free_trace) -> None:
    """A prefill_first trace has no mixed step; chunked prefill is still predicted."""
    chunked = {"policy": "chunked", "max_num_batched_tokens": 512}
    measured = record_workload(CONFIG.replace(**chunked), staggered_requests(), NOISE_FREE)
    model = CostModel.fit(noise_free_trace)
    x, classes = feature_matrix(measured, causal=model.causal_work)
    assert (classes == "mixed").sum() > 50
    assert "mixed" not in model.fits
    predicted = model.fitted_times(x, classes)
    mixed = classes == "mixed"
    actual = step_intervals(measured)
    assert predicted[mixed] == pytest.approx(actual[mixed], rel=1e-6)
    result = simulate(noise_free_trace, chunked)
    assert result.metrics["makespan_s"] == pytest.approx(
        compute(measured).summary["makespan_s"], rel=0.01)


def test_a_trace_without_timings_is_refused_clearly() -> None:
    untimed = record_workload(CONFIG, staggered_requests(count=8), law=None)
    with pytest.raises(CostModelError, match="no measured step times"):
        CostModel.fit(untimed, source="cpu-trace")


def test_save_and_load_round_trip(noise_free_trace, tmp_path) -> None:
    model = CostModel.fit(noise_free_trace, source="t")
    path = tmp_path / "model.json"
    model.save(path)
    loaded = CostModel.load(path)
    x, classes = feature_matrix(noise_free_trace)
    assert loaded.fitted_times(x, classes) == pytest.approx(model.fitted_times(x, classes))
    assert loaded.graph_sizes == model.graph_sizes and loaded.heldout == model.heldout
    assert loaded.coverage == model.coverage and loaded.window_steps == model.window_steps
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(CostModelError, match="bad.json"):
        CostModel.load(tmp_path / "bad.json")


def test_describe_reports_the_heldout_error(noise_free_trace) -> None:
    text = CostModel.fit(noise_free_trace, source="trace-A").describe()
    assert "trace-A" in text and "held-out MAPE" in text and "decode_graph" in text


def test_a_one_off_slow_first_step_is_charged_once_not_spread_over_all_steps() -> None:
    """A JIT-compiling first step must not make every predicted prefill slower."""
    compile_s = 2.0
    law = StepLaw(first_step_s=compile_s)
    requests = reference_workload(num_seqs=64)
    a = record_workload(Config(num_kvcache_blocks=400, max_num_seqs=64), requests, law, seed=1)
    b_config = {"num_kvcache_blocks": 180, "max_num_seqs": 48}
    b = record_workload(Config(**b_config), requests, law, seed=2)
    model = CostModel.fit(a)
    assert model.warmup_s == {"prefill": pytest.approx(compile_s, rel=0.01)}
    assert "warm-up" in model.describe()
    result = simulate(a, b_config, timing=model)
    measured = compute(b).summary
    assert result.metrics["makespan_s"] == pytest.approx(measured["makespan_s"], rel=0.03)
    assert result.metrics["ttft_mean_s"] == pytest.approx(measured["ttft_mean_s"], rel=0.05)


def test_a_warm_start_leaves_the_one_off_out_and_compare_follows_the_target_header() -> None:
    """The one-off is a property of a fresh process, not of the configuration: a prediction for a
    run that starts warm leaves it out (exactly the charge less), one for a cold run or one whose
    start is unknown (a header before ``engine_starts_before``) pays it once."""
    from replay.whatif.simulate import cold_start_of, load_source, run_variant

    compile_s = 2.0
    law = StepLaw(first_step_s=compile_s)
    a = record_workload(Config(num_kvcache_blocks=400, max_num_seqs=64),
                        reference_workload(num_seqs=64), law, seed=1)
    model, source = CostModel.fit(a), load_source(a)
    overrides = {"max_num_seqs": 48}
    cold, warm, unknown = (run_variant(source, overrides, model, cold_start=flag).metrics
                           for flag in (True, False, None))
    assert cold["makespan_s"] == pytest.approx(unknown["makespan_s"])
    assert cold["makespan_s"] - warm["makespan_s"] == pytest.approx(compile_s, rel=0.01)
    assert cold_start_of({"engine_starts_before": 0}) is True
    assert cold_start_of({"engine_starts_before": 2}) is False
    assert cold_start_of({}) is None


# --- physics: launch floors, extrapolation, warm-up, coverage ------------------------------------
@dataclass(frozen=True)
class FlooredLaw(CausalLaw):
    """CausalLaw with an eager launch floor (a prefill takes at least ``floor_s``) and a warm-up:
    step i of the run takes ``warm[i]`` times as long."""

    floor_s: float = 0.0
    warm: tuple[float, ...] = ()

    def duration(self, batch: ScheduledBatch, padded: int, rng: np.random.Generator,
                 padded_rows: int = 0) -> float:
        seconds = super().duration(batch, padded, rng, padded_rows)
        if batch.kind != "decode":
            seconds = max(seconds, self.floor_s)
        return seconds * (self.warm[batch.step] if batch.step < len(self.warm) else 1.0)


FLOOR_S = 6e-3  # prompts up to ~2,900 tokens sit on it under StepLaw's magnitudes
FLOORED = FlooredLaw(noise=0.0, flush_every=0, floor_s=FLOOR_S)


def varied_requests(count: int = 120, lo: int = 20, hi: int = 4000, start_s: float = 0.0,
                    seed: int = 0) -> list[Request]:
    """Requests arriving one by one, prompts of lo..hi tokens: prefills on and above the floor."""
    rng = np.random.default_rng(seed)
    return [
        Request(rng.integers(0, 9000, size=int(rng.integers(lo, hi))).tolist(),
                int(rng.integers(20, 200)), arrival_s=start_s + 0.03 * i)
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def floored_trace():
    return record_workload(CONFIG, varied_requests(), FLOORED)


def test_an_eager_launch_floor_is_recovered_and_chosen_by_held_out_error(floored_trace) -> None:
    model = CostModel.fit(floored_trace)
    fit = model.fits["prefill"]
    assert fit.floor == pytest.approx(FLOOR_S, rel=1e-6)
    assert fit.coef[FEATURES.index("prefill_tokens")] == pytest.approx(
        FLOORED.per_prefill_token_s, rel=1e-6)
    scores = model.selection["prefill"]["candidates"]
    assert min(scores, key=scores.get).startswith("max(floor")
    assert scores["floor only"] > 1.0 and scores["prefill_tokens"] > 1.0  # each misses a regime
    assert model.heldout["prefill"]["mape_pct"] < 0.01
    # Another config's prefills, on and above the floor, predicted from this one.
    other = record_workload(CONFIG, varied_requests(seed=1), FLOORED)
    x, classes = feature_matrix(other, causal=model.causal_work)
    prefill = classes == "prefill"
    assert model.fitted_times(x[prefill], classes[prefill]) == pytest.approx(
        step_intervals(other)[prefill], rel=1e-6)
    assert "6.00 ms floor" in model.describe()


def test_a_noisy_floor_is_still_preferred_to_a_line() -> None:
    trace = record_workload(CONFIG, varied_requests(), FlooredLaw(floor_s=FLOOR_S))
    model = CostModel.fit(trace)
    assert model.fits["prefill"].floor == pytest.approx(FLOOR_S, rel=0.03)
    assert model.heldout["prefill"]["mape_pct"] < 3.0  # about the 3% noise


def test_the_simulators_per_step_prediction_applies_the_floor(floored_trace) -> None:
    model = CostModel.fit(floored_trace)
    fit = model.fits["prefill"]
    x, classes = feature_matrix(floored_trace)
    prefill = x[classes == "prefill"]
    per_step = np.array([model.predict(row.tolist(), "prefill").device_s for row in prefill])
    assert per_step == pytest.approx(fit.predict(prefill), rel=1e-12)
    on_floor = fit.linear(prefill) < fit.floor
    assert on_floor.any() and (per_step[on_floor] == fit.floor).all()


def saturating_decodes(lo: int, hi: int, n: int, rng: np.random.Generator):
    """Decode steps whose per-sequence cost stops growing at 16 sequences (the GPU fills up)."""
    seqs = rng.integers(lo, hi + 1, n).astype(float)
    ctx = seqs * rng.uniform(500, 1500, n)
    x = np.zeros((n, len(FEATURES)))
    for name in ("num_seqs", "decode_seqs", "padded_batch_size"):
        x[:, FEATURES.index(name)] = seqs
    for name in ("decode_context_tokens", "decode_kv_tokens"):
        x[:, FEATURES.index(name)] = ctx
    y = (1.5e-3 + 3e-8 * ctx + 2e-5 * np.minimum(seqs, 16)) * np.exp(rng.normal(0, 0.03, n))
    return x, y


def test_decode_features_are_chosen_by_how_they_extrapolate_to_larger_batches() -> None:
    """A per-sequence slope measured on batches <= 64 helps there but overshoots at 256."""
    rng = np.random.default_rng(0)
    x, y = saturating_decodes(1, 64, 2000, rng)
    fit, report = select("decode_graph", x, y)
    assert fit is not None and report["holdout"] == "extrapolation"
    assert fit.features == ("decode_kv_tokens",)
    # Interpolating, the per-sequence slope would have won; at 128-256 sequences it loses.
    test = np.zeros(len(y), dtype=bool)
    test[4::5] = True
    richer = ("decode_seqs", "decode_kv_tokens")

    def mape(f, xs, ys):
        return float(np.mean(np.abs(f.predict(xs) - ys) / ys))

    assert mape(fit_linear(x[~test], y[~test], richer), x[test], y[test]) < mape(
        fit_linear(x[~test], y[~test], fit.features), x[test], y[test])
    big_x, big_y = saturating_decodes(128, 256, 500, rng)
    assert mape(fit, big_x, big_y) < mape(fit_linear(x, y, richer), big_x, big_y)


def test_an_intercept_is_never_negative() -> None:
    """Prefills of nearly one size cannot identify an intercept: no negative time at 0 tokens."""
    rng = np.random.default_rng(0)
    x = np.zeros((9, len(FEATURES)))
    x[:, FEATURES.index("prefill_tokens")] = rng.integers(14000, 16400, 9)
    y = 2.3e-6 * x[:, 1] * np.exp(rng.normal(0, 0.03, 9))
    y[4] *= 1.4
    fit = fit_linear(x, y, ("prefill_tokens",))
    assert fit.intercept >= 0.0 and min(fit.coef) >= 0.0
    assert fit.predict(x).sum() == pytest.approx(y.sum(), rel=0.05)


def test_a_source_without_small_prefills_warns_that_the_launch_floor_is_unknown() -> None:
    """Like a run whose every request arrived at once: prefills of ~16k tokens only."""
    rng = np.random.default_rng(0)
    burst = [Request(rng.integers(0, 9000, size=int(rng.integers(950, 1050))).tolist(), 30)
             for _ in range(160)]
    source = record_workload(Config(num_kvcache_blocks=1200), burst, FLOORED)
    model = CostModel.fit(source)
    assert model.fits["prefill"].floor == 0.0  # no floor without a range of sizes to show one
    assert "the floor is unknown" in model.describe()
    target = record_workload(CONFIG, varied_requests(lo=20, hi=600), FLOORED)
    warnings = model.coverage_warnings(target)
    assert any("eager launch floor unknown, prediction may be low" in w for w in warnings)
    assert "eager launch floor unknown" in model.describe(target=target)
    assert not CostModel.fit(target).coverage_warnings(target)  # its own steps: all covered


def test_decode_batches_far_beyond_the_source_are_flagged() -> None:
    requests = reference_workload(num_seqs=64)
    small = record_workload(Config(num_kvcache_blocks=400, max_num_seqs=16), requests, seed=1)
    large = record_workload(Config(num_kvcache_blocks=400, max_num_seqs=64), requests, seed=2)
    warnings = CostModel.fit(small).coverage_warnings(large)
    assert any("decode_graph steps much larger than any in the source" in w
               and "the source's largest had 16 sequences" in w for w in warnings)


def test_a_model_file_of_another_version_is_refused(noise_free_trace, tmp_path) -> None:
    data = CostModel.fit(noise_free_trace, source="t").to_dict()
    data["version"] = MODEL_VERSION - 1
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CostModelError, match=f"cost model version {MODEL_VERSION - 1}, "
                                             f"expected {MODEL_VERSION}"):
        CostModel.load(path)


def test_a_floored_model_round_trips(floored_trace, tmp_path) -> None:
    model = CostModel.fit(floored_trace, source="t")
    model.save(tmp_path / "model.json")
    loaded = CostModel.load(tmp_path / "model.json")
    assert loaded.fits == model.fits
    x, classes = feature_matrix(floored_trace)
    assert (loaded.fitted_times(x, classes) == model.fitted_times(x, classes)).all()


def test_a_header_calibration_identifies_a_floor_the_run_never_touched() -> None:
    """Every prefill of this run is compute-bound, so its own steps cannot show the launch floor;
    the start-up calibration (engine/calibration.py) the header carries can, and the fit uses it."""
    from engine.calibration import calibration_batches
    from engine.engine_core import batch_features

    large_only = varied_requests(count=60, lo=3600, hi=4000)
    trace = record_workload(CONFIG, large_only, FLOORED)
    small = np.zeros((1, len(FEATURES)))
    small[0, FEATURES.index("num_seqs")] = 1
    small[0, FEATURES.index("prefill_tokens")] = 100
    small[0, FEATURES.index("prefill_attn_work")] = 100 * 100
    blind = CostModel.fit(trace).fitted_times(small, np.array(["prefill"]))[0]
    assert blind < 0.6 * FLOOR_S  # predicted from the compute slope: far below the floor

    rng = np.random.default_rng(0)
    rows = []
    for batch in calibration_batches(CONFIG):
        batch.step = 10**6  # the law's warm-up and first-step terms are for run steps only
        prefill_tokens, work, decode_seqs, context = batch_features(batch)
        rows.append({
            "kind": batch.kind, "num_seqs": len(batch.seqs), "prefill_tokens": prefill_tokens,
            "prefill_attn_work": work, "decode_seqs": decode_seqs,
            "decode_context_tokens": context, "padded_batch_size": len(batch.seqs),
            "graph_used": False, "interval_s": FLOORED.duration(batch, 0, rng),
        })
    assert any(r["kind"] == "prefill" and r["prefill_tokens"] == 1 for r in rows)
    trace.header["calibration"] = rows
    informed = CostModel.fit(trace)
    assert informed.fits["prefill"].floor == pytest.approx(FLOOR_S, rel=1e-6)
    predicted = informed.fitted_times(small, np.array(["prefill"]))[0]
    assert predicted == pytest.approx(FLOOR_S, rel=1e-6)
