"""A graph decode priced off its class fit on the device profile's grid
(``CostOptions.decode_grid``, ``decode_grid.DecodeGrid``): a decode's time is not linear in its
rows (at a few rows its projections run other kernels), and the pooled fit prices the few-row
steps 10-20% slow (BENCHMARKS 7ag).

What these tests prove:
- the grid holds the profile's time over the fit's at each (padded rows, context) point, and a
  step is priced at the fit times that residual, interpolated in log2 of both axes, the edge
  beyond the grid; per step and over arrays alike;
- only the profile's uniform graph decodes make the grid (not its spread, shared-prefix or
  eager rows);
- fitted from a profile whose few-row decodes run 20% under the law, the model with the grid
  prices them at the profile's time, without it 5% or more slow; a saved model keeps the grid;
- it is opt-in: the default model has none.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from engine.config import Config
from replay.whatif.cost.decode_grid import DecodeGrid, uniform_graph_decodes
from replay.whatif.cost.features import FEATURES, calibration_steps
from replay.whatif.cost.linear import LinearFit
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.options import CostOptions
from replay.whatif.synthetic import StepLaw, law_profile, record_workload
from replay.workloads.builtin import reference_workload

AT = FEATURES.index
FIT = LinearFit(1.0e-3, tuple(2e-6 if f == "padded_batch_size" else 1e-8 if f ==
                              "decode_context_tokens" else 0.0 for f in FEATURES),
                ("padded_batch_size", "decode_context_tokens"), 100)


def _decode(rows: int, context: int) -> list[float]:
    x = [0.0] * len(FEATURES)
    x[AT("num_seqs")] = x[AT("decode_seqs")] = x[AT("padded_batch_size")] = rows
    x[AT("decode_context_tokens")] = x[AT("decode_kv_tokens")] = rows * context
    return x


def _residual(rows: int) -> float:
    """The synthetic profile's time over the fit's: 0.8 at a few rows, 1 from 64."""
    return 0.8 if rows <= 4 else 1.0 if rows >= 64 else 0.9


def test_a_step_is_priced_at_the_residual_interpolated_on_the_grid() -> None:
    points = [_decode(r, c) for r in (1, 4, 16, 64, 256) for c in (128, 1024, 8192)]
    x = np.array(points)
    time = FIT.predict(x) * np.array([_residual(int(p[AT("padded_batch_size")]))
                                      for p in points])
    grid = DecodeGrid.of(x, time, FIT)
    assert grid is not None and len(grid.levels) == 5
    assert grid.factor(_decode(1, 1024)) == pytest.approx(0.8)
    assert grid.factor(_decode(256, 128)) == pytest.approx(1.0)
    # Between levels, linear in log2 of the rows: 8 rows lie halfway from 4 to 16.
    assert math.log(grid.factor(_decode(8, 1024))) == pytest.approx(
        (math.log(0.8) + math.log(0.9)) / 2)
    # Beyond the grid, its edge: 512 rows as 256, a context of 32k as 8k.
    assert grid.factor(_decode(512, 32768)) == pytest.approx(1.0)
    assert grid.factor(_decode(2, 32768)) == pytest.approx(0.8)
    steps = np.array([_decode(r, c) for r in (1, 3, 8, 100, 512) for c in (64, 3000)])
    assert grid.factors(steps) == pytest.approx([grid.factor(s) for s in steps.tolist()])
    assert DecodeGrid.from_dict(grid.to_dict()) == grid


def test_a_level_with_one_context_or_a_single_level_makes_no_grid() -> None:
    x = np.array([_decode(1, 128), _decode(1, 1024), _decode(4, 128)])
    assert DecodeGrid.of(x, FIT.predict(x), FIT) is None


def _rows(profile: dict) -> list[dict]:
    return profile["rows"]


LAW = StepLaw(noise=0.0, flush_every=0)
SOURCE = Config(num_kvcache_blocks=2000, max_num_seqs=64)
DEVICE = Config(max_model_len=4096, max_num_seqs=512, max_num_batched_tokens=32768,
                num_kvcache_blocks=60000)
FEW = 4  # padded rows up to which the edited profile's graph decodes run 20% faster


@pytest.fixture(scope="module")
def fitted() -> tuple:
    """The source, a law profile whose few-row graph decodes run 20% under the law, and the
    model fitted with and without the grid."""
    source = record_workload(SOURCE, reference_workload()[:64], LAW)
    profile = copy.deepcopy(law_profile(DEVICE, LAW))
    for row in uniform_graph_decodes(_rows(profile)):
        if row["padded_batch_size"] <= FEW:
            for name in ("duration_s", "interval_s", "wait_s"):
                row[name] *= 0.8
    return (source, profile,
            CostModel.fit(source, profile=profile, options=CostOptions(decode_grid=True)),
            CostModel.fit(source, profile=profile))


def test_only_uniform_graph_decodes_make_the_grid() -> None:
    uniform = {"kind": "decode", "graph_used": True, "decode_seqs": 4,
               "decode_context_tokens": 4096, "decode_context_max": 1024, "cached_tokens": 0}
    rows = [uniform,
            {**uniform, "graph_used": False},  # eager
            {**uniform, "decode_context_max": 3000},  # a spread of lengths
            {**uniform, "prefix_groups": 1},  # over a shared prefix
            {**uniform, "cached_tokens": 512},
            {**uniform, "kind": "mixed"}]
    assert uniform_graph_decodes(rows) == [uniform]


def test_the_grid_prices_the_few_row_decodes_at_the_profiles_time(fitted, tmp_path) -> None:
    source, profile, with_grid, plain = fitted
    assert plain.decode_grid is None and with_grid.decode_grid is not None
    few = [r for r in uniform_graph_decodes(_rows(profile)) if r["padded_batch_size"] <= FEW]
    steps = calibration_steps(few, with_grid.overlap is not None, 0.0)
    scale = with_grid.prior.scale["decode_graph"]  # the profile's rows at the source's speed
    for step, took in zip(steps.x.tolist(), (steps.time * scale).tolist()):
        graded = with_grid.predict(step, "decode_graph").device_s
        assert graded == pytest.approx(took, rel=0.03)
        assert plain.predict(step, "decode_graph").device_s > 1.05 * took
    path = tmp_path / "model.json"
    with_grid.save(path)
    loaded = CostModel.load(path)
    assert loaded.decode_grid == with_grid.decode_grid
    step = steps.x[0].tolist()
    assert loaded.predict(step, "decode_graph").device_s == with_grid.predict(
        step, "decode_graph").device_s
    assert np.allclose(loaded.fitted_times(steps.x, steps.classes),
                       [with_grid.predict(s, "decode_graph").device_s for s in steps.x.tolist()])


def test_it_is_opt_in() -> None:
    assert CostOptions().decode_grid is False
    assert CostOptions.parse(["decode_grid=on"]).decode_grid is True
