"""The two cost options of BENCHMARKS 7l, on by default: ``causal_work`` and ``relative_roofline``.

What these tests prove:
- ``causal_work`` counts a fresh prompt's attention once (n^2 / 2 of its recorded n^2) and a few
  new tokens over a cached prefix about in full, by one rule (``linear.causal_work``) read alike
  by a recording's features (from its scheduled rows), a profile's or calibration's rows (prompts
  of one length) and the simulator (from the batch it prices); off, every feature is as recorded;
- ``relative_roofline`` fits the roofline's linear part by relative error: on prefills whose
  longest steps the law does not explain (a 10% excess), the short latency-bound steps are priced
  closer than by plain least squares, which lets the longest steps set the linear part;
- both are on by default; switched off, each travels in a fitted model's options.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cost_helpers import RecordingCost

from engine.batch import ScheduledBatch
from engine.config import Config
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.whatif.cost.features import calibration_features, feature_matrix
from replay.whatif.cost.linear import FEATURES, PREFILL_LONGEST, causal_work
from replay.whatif.cost.lstsq import fit_linear
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.options import CostOptions
from replay.whatif.cost.roofline import refit
from replay.whatif.sim_executor import SimClock, SimExecutor
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.request import Request

WORK = FEATURES.index("prefill_attn_work")


def _row(num_seqs: int, tokens: int, cached: int = 0) -> dict:
    new = tokens // num_seqs
    return {"kind": "prefill", "graph_used": True, "num_seqs": num_seqs, "prefill_tokens": tokens,
            "prefill_attn_work": num_seqs * new * (new + cached // num_seqs), "decode_seqs": 0,
            "decode_context_tokens": 0, "padded_batch_size": num_seqs, "padded_tokens": tokens,
            "cached_tokens": cached}


def test_a_fresh_prompt_counts_half_and_a_cached_prefix_nearly_all() -> None:
    rows = [_row(1, 2048), _row(1, 256, cached=2304), _row(4, 4096)]
    plain, causal = calibration_features(rows), calibration_features(rows, causal=True)
    assert plain[:, WORK].tolist() == [2048.0 ** 2, 256.0 * 2560, 4 * 1024.0 ** 2]
    assert causal[:, WORK].tolist() == [2048.0 ** 2 / 2, 256.0 * 2560 - 256.0 ** 2 / 2,
                                        4 * 1024.0 ** 2 / 2]
    other = [i for i in range(len(FEATURES)) if i != WORK]
    assert (plain[:, other] == causal[:, other]).all()


def test_a_recording_counts_each_steps_prompts_from_its_scheduled_rows() -> None:
    requests = [Request(list(range(1, 1 + n)), 3, arrival_s=0.0) for n in (40, 72, 24)]
    events = record_workload(Config(num_kvcache_blocks=64, max_num_seqs=8), requests,
                             StepLaw(noise=0.0, flush_every=0), seed=1)
    plain, _ = feature_matrix(events)
    causal, _ = feature_matrix(events, causal=True)
    scheduled = events.tables["seq_scheduled"]
    steps = np.asarray(events.tables["model_step"]["step"])
    for row, step in enumerate(steps.tolist()):
        new = [n for s, n in zip(scheduled["step"], scheduled["num_new_tokens"])
               if s == step and n != 1]
        assert causal[row, WORK] == causal_work(plain[row, WORK], sum(n * n for n in new))
    assert (causal[:, WORK] < plain[:, WORK]).any()


@pytest.mark.parametrize("causal", [False, True])
def test_the_simulator_counts_a_batch_by_the_same_rule(causal: bool) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    seqs = [Sequence(0, [1] * 30, params), Sequence(1, [1] * 20, params)]
    cost = RecordingCost(causal)
    executor = SimExecutor(100, SimClock(), cost)  # type: ignore[arg-type]
    # 10 new tokens over 20 cached, and 20 fresh: recorded work 10 x 30 + 20 x 20.
    executor.execute(ScheduledBatch(0, "prefill", seqs, [10, 20], [30, 20], 2,
                                    sampled_seqs=seqs))
    assert cost.seen[0].prefill_attn_work == (causal_work(700, 10 ** 2 + 20 ** 2) if causal
                                              else 700)


def _prefills(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Short prefills of a few new tokens over long cached prefixes (bound by their longest
    program) and long fresh ones, by a roofline law; the long ones 10% dearer than the law."""
    rng = np.random.default_rng(seed)
    n = 200
    x = np.zeros((n, len(FEATURES)))
    short = np.arange(n) % 2 == 0
    new = np.where(short, rng.integers(64, 256, n), rng.integers(4096, 16384, n)).astype(float)
    context = np.where(short, rng.integers(1024, 8192, n), new).astype(float)
    x[:, FEATURES.index("padded_tokens")] = new
    x[:, WORK] = new * context
    x[:, FEATURES.index(PREFILL_LONGEST)] = context
    y = 1e-3 + 1.5e-6 * new + np.maximum(4e-10 * x[:, WORK], 6e-7 * context)
    y = np.where(short, y, 1.1 * y)
    return x, y


def test_a_relative_refit_prices_the_short_steps_closer() -> None:
    x, y = _prefills()
    names = ("padded_tokens", "prefill_attn_work")
    plain = refit(fit_linear(x, y, names), x, y, names)
    relative = refit(fit_linear(x, y, names), x, y, names, relative=True)
    short = np.arange(len(y)) % 2 == 0

    def error(fit) -> float:
        return float(np.mean(np.abs(fit.predict(x[short]) - y[short]) / y[short]))

    assert error(relative) < 0.5 * error(plain)
    assert relative.prefill_longest_s == pytest.approx(6e-7, rel=0.1)


def test_the_options_default_on_and_switching_them_off_travels_in_the_model() -> None:
    """Both options are on by default: a default fit counts work causally, and its ``options``
    (which keep what differs from the defaults) name neither. Switched off, each travels in
    the model's options as False, and ``causal_work=off`` parses to a model that counts work as
    recorded."""
    requests = [Request(list(range(1, 1 + n)), 4, arrival_s=0.0) for n in (40, 72, 24, 96)]
    events = record_workload(Config(num_kvcache_blocks=64, max_num_seqs=8), requests,
                             StepLaw(noise=0.0, flush_every=0), seed=1)
    assert CostOptions().causal_work and CostOptions().relative_roofline
    default = CostModel.fit(events)
    assert default.causal_work
    assert "causal_work" not in default.options and "relative_roofline" not in default.options
    off = CostOptions(causal_work=False, relative_roofline=False)
    neither = CostModel.fit(events, options=off)
    assert not neither.causal_work
    assert neither.options["causal_work"] is False
    assert neither.options["relative_roofline"] is False
    parsed = CostOptions.parse(["causal_work=off"])
    assert not parsed.causal_work and parsed.relative_roofline
    assert not CostModel.fit(events, options=parsed).causal_work
