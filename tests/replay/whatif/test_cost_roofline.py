"""The prefill attention's roofline (``replay.whatif.cost.roofline``): attention takes the longer of
its work over the GPU and its longest program, which reads the longest prefill context.

What these tests prove:
- on prefills drawn from a law with that roofline (few new tokens over long cached prefixes
  beside many fresh tokens), the slope per key of the longest program and the linear part are
  recovered, and the prediction of a latency-bound step improves on the plain fit;
- a law without it keeps the plain fit (no slope where none helps);
- the slope is the kernel's: every class that runs prefill attention gets it, decodes do not;
- the roofline only ever adds time, survives a saved model, and prices one step in plain floats
  (the simulator's path) as the array path does;
- the simulator hands the step's longest prefill context to the model.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cost_helpers import RecordingCost

from engine.batch import ScheduledBatch
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.whatif.cost.fit import fit_linear
from replay.whatif.cost.linear import FEATURES, PREFILL_LONGEST, LinearFit
from replay.whatif.cost.roofline import refit, with_roofline
from replay.whatif.sim_executor import SimClock, SimExecutor

AT = FEATURES.index
BASE_S, PER_TOKEN_S, PER_WORK_S, PER_KEY_S = 1.1e-3, 1.3e-6, 5.6e-10, 4.5e-7
FEATURE_SET = ("padded_tokens", "prefill_attn_work")


def prefills(n: int = 240, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One-prompt prefills: half fresh (1-4,096 tokens), half a few new tokens over a cached
    prefix of up to 16k; times by the roofline law, 1% noise."""
    rng = np.random.default_rng(seed)
    new = rng.integers(1, 4097, n).astype(float)
    cached = np.where(np.arange(n) % 2 == 0, 0.0, rng.integers(256, 16384, n))
    new = np.where(cached > 0, rng.integers(16, 512, n), new)
    x = np.zeros((n, len(FEATURES)))
    x[:, AT("num_seqs")] = 1
    x[:, AT("prefill_tokens")] = x[:, AT("padded_tokens")] = new
    x[:, AT("prefill_attn_work")] = new * (cached + new)
    x[:, AT(PREFILL_LONGEST)] = cached + new
    work = PER_WORK_S * x[:, AT("prefill_attn_work")]
    y = BASE_S + PER_TOKEN_S * new + np.maximum(work, PER_KEY_S * x[:, AT(PREFILL_LONGEST)])
    return x, y * np.exp(rng.normal(0, 0.01, n))


def test_the_roofline_law_is_recovered() -> None:
    x, y = prefills()
    plain = fit_linear(x, y, FEATURE_SET)
    fitted = refit(plain, x, y, FEATURE_SET)
    assert fitted.prefill_longest_s == pytest.approx(PER_KEY_S, rel=0.1)
    assert fitted.coef[AT("prefill_attn_work")] == pytest.approx(PER_WORK_S, rel=0.1)
    assert fitted.intercept == pytest.approx(BASE_S, rel=0.15)
    bound = x[:, AT(PREFILL_LONGEST)] * PER_KEY_S > x[:, AT("prefill_attn_work")] * PER_WORK_S
    def error(fit: LinearFit) -> float:
        return float(np.mean(np.abs(fit.predict(x[bound]) / y[bound] - 1)))
    assert error(fitted) < 0.03 < error(plain)


def test_a_law_without_it_keeps_the_plain_fit() -> None:
    x, _ = prefills()
    y = BASE_S + PER_TOKEN_S * x[:, AT("padded_tokens")] + PER_WORK_S * x[:, AT(
        "prefill_attn_work")]
    plain = fit_linear(x, y, FEATURE_SET)
    assert refit(plain, x, y) == plain


def test_the_slope_is_the_kernels_for_every_prefill_class() -> None:
    x, y = prefills()
    plain = fit_linear(x, y, FEATURE_SET)
    fits = {name: plain for name in ("prefill_graph", "prefill", "mixed_graph", "decode_graph")}
    out = with_roofline(fits, x, y, np.array(["prefill_graph"] * len(y)))
    slope = out["prefill_graph"].prefill_longest_s
    assert slope > 0
    assert out["prefill"].prefill_longest_s == out["mixed_graph"].prefill_longest_s == slope
    assert out["decode_graph"].prefill_longest_s == 0.0
    assert out["prefill"].coef == plain.coef  # each class keeps its own linear part


def test_the_roofline_only_adds_time_and_travels() -> None:
    x, y = prefills()
    fitted = refit(fit_linear(x, y, FEATURE_SET), x, y)
    plain = LinearFit(fitted.intercept, fitted.coef, fitted.features, fitted.samples)
    assert (fitted.linear(x) >= plain.linear(x)).all()
    assert LinearFit.from_dict(fitted.to_dict()) == fitted
    for row in x[:20]:
        assert fitted.linear_at(row.tolist()) == pytest.approx(float(fitted.linear(row[None])[0]))


def test_the_simulator_prices_a_step_by_its_longest_prefill_context() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    # Two prompts: 24 new tokens over 1,000 cached, and 40 fresh ones.
    seqs = [Sequence(0, [1] * 1024, params), Sequence(1, [1] * 40, params)]
    cost = RecordingCost()
    executor = SimExecutor(100, SimClock(), cost)  # type: ignore[arg-type]
    executor.execute(ScheduledBatch(0, "prefill", seqs, [24, 40], [1024, 40], 2,
                                    sampled_seqs=seqs))
    assert cost.seen[0].prefill_longest_tokens == 1024
    assert cost.seen[0].decode_longest_tokens == 0
