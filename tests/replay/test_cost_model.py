"""The step-time model: least squares per step class, with its error on held-out steps.

What these tests prove: a noise-free linear step law is recovered exactly (held-out error ~0,
the per-context-token cost to 1e-6); with noise the held-out error is honest (about the noise,
not 0); idle gaps waiting for arrivals are not counted as step time; slopes are never negative;
CUDA-graph padding is learned from the trace; a mixed (chunked) step is predicted from prefill
and decode fits when the source had none; a trace without timings is refused with a clear
message; save/load round-trips.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import Config
from replay.bench_whatif import StepLaw, record_workload
from replay.cost_model import (
    FEATURES,
    CostModel,
    CostModelError,
    feature_matrix,
    fit_linear,
    step_intervals,
)
from replay.metrics import compute
from replay.simulate import simulate
from replay.workloads import Request, reference_workload

NOISE_FREE = StepLaw(noise=0.0, flush_every=0)
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
    ctx = model.fits["decode_graph"].coef[FEATURES.index("decode_context_tokens")]
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
    model = CostModel.fit(noise_free_trace)
    assert model.padded_size(1) == 1 and model.padded_size(3) == 4
    assert model.padded_size(17) == 32 and model.padded_size(512) == 512
    assert model.padded_size(513) == 0  # larger than any graph: eager


def test_mixed_steps_are_predicted_from_prefill_and_decode_fits(noise_free_trace) -> None:
    """A prefill_first trace has no mixed step; chunked prefill is still predicted."""
    chunked = {"policy": "chunked", "max_num_batched_tokens": 512}
    measured = record_workload(CONFIG.replace(**chunked), staggered_requests(), NOISE_FREE)
    x, classes = feature_matrix(measured)
    assert (classes == "mixed").sum() > 50
    model = CostModel.fit(noise_free_trace)
    assert "mixed" not in model.fits
    predicted = model.predict_many(x, classes)
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
    assert loaded.predict_many(x, classes) == pytest.approx(model.predict_many(x, classes))
    assert loaded.graph_sizes == model.graph_sizes and loaded.heldout == model.heldout
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
