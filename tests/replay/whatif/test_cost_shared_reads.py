"""Decodes over shared prefixes: the cost of re-reading a block other rows read too, measured on
a profile's shared-prefix rows of each shape (how their time moves with what they share),
priced by the simulator from each step's distinct blocks; a profile without such rows (or the
mechanism off) prices as before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.config import Config
from engine.profiling import ProfilePoint
from replay.whatif.cost import shared_reads
from replay.whatif.cost.features import FEATURES, calibration_features
from replay.whatif.cost.lstsq import fit_linear
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.options import CostOptions
from replay.whatif.cost.profile import merge_profiles
from replay.whatif.sim_executor import SimClock, SimExecutor
from replay.whatif.synthetic import StepLaw, law_profile, record_workload
from replay.workloads.builtin import reference_workload

LAW = StepLaw(noise=0.0, flush_every=0)
SOURCE = Config(num_kvcache_blocks=2000, max_num_seqs=64)
DEVICE = Config(max_model_len=4096, max_num_seqs=512, max_num_batched_tokens=32768,
                num_kvcache_blocks=60000)
POOLED = CostOptions(profile_mode="pooled")
BLEND = CostOptions(profile_mode="blend")


def _rereads(row: dict[str, Any]) -> int:
    return (row["decode_seqs"] - row["prefix_groups"]) * row["prefix_tokens"]


def profile_with_l2(fraction: float) -> dict[str, Any]:
    """The law's profile, each shared-prefix row timed as if a re-read cost ``fraction`` of a
    read from memory (the law prices every context token as one)."""
    profile = law_profile(DEVICE, LAW)
    for row in profile["rows"]:
        if row.get("prefix_groups"):
            saved = (1 - fraction) * LAW.per_context_token_s * _rereads(row)
            for name in ("interval_s", "duration_s", "wait_s", "interval_p10_s",
                         "interval_p90_s"):
                if row.get(name) is not None:
                    row[name] -= saved
    return profile


@pytest.fixture(scope="module")
def source():
    return record_workload(SOURCE, reference_workload()[:64], LAW)


def test_a_profile_row_over_a_shared_prefix_reads_each_prefix_once() -> None:
    """``decode_kv_tokens`` of a shared-prefix row: its context less the prefix tokens every row
    but one of each group reads again; other rows read their whole context."""
    rows = [r for r in law_profile(DEVICE, LAW)["rows"] if r.get("prefix_groups")]
    x = calibration_features(rows)
    context, kv = FEATURES.index("decode_context_tokens"), FEATURES.index("decode_kv_tokens")
    assert rows and np.allclose(x[:, context] - x[:, kv], [_rereads(r) for r in rows])
    assert (shared_reads.rereads(x) > 0).all()
    plain = calibration_features([{**rows[0], "prefix_groups": 0}])
    assert plain[0, kv] == plain[0, context]


@pytest.mark.parametrize("fraction", [0.0, 0.4, 1.0])
def test_the_fraction_is_the_one_the_shared_rows_were_timed_at(source, fraction: float) -> None:
    """Pooled or as the profile's own prior, the fitted fraction is the one the rows were timed
    at; the simulator counts distinct blocks only where it is below 1."""
    profile = profile_with_l2(fraction)
    pooled = CostModel.fit(source, profile=profile, options=POOLED)
    assert pooled.shared_read_fraction == pytest.approx(fraction)
    assert pooled.shared_kv == (fraction < 1)
    blend = CostModel.fit(source, profile=profile, options=BLEND)
    assert blend.shared_read_fraction == 1.0  # the source's own steps share nothing
    assert blend.prior.shared_read_fraction == pytest.approx(fraction)
    assert blend.shared_kv == (fraction < 1)
    assert ("re-reads of a block" in pooled.describe()) == (fraction < 1)


def test_a_drift_between_levels_is_not_read_as_a_discount(source) -> None:
    """Shared rows all 3% faster than the law whatever they share (the device's state when
    their level ran, as in the H200 profiles): the fraction is measured within each shape, so
    it stays 1 and the simulator counts no blocks."""
    profile = law_profile(DEVICE, LAW)
    for row in profile["rows"]:
        if row.get("prefix_groups"):
            for name in ("interval_s", "duration_s", "wait_s"):
                row[name] *= 0.97
    model = CostModel.fit(source, profile=profile, options=POOLED)
    assert model.shared_read_fraction == 1.0 and not model.shared_kv


def test_without_shared_rows_or_with_the_mechanism_off_the_fits_are_as_before(source) -> None:
    """An older profile (no shared-prefix rows) and ``shared_reads=off`` give the fits of a
    profile whose shared rows are left out; shared rows timed like their twins change nothing
    either (fraction 1), and ``shared_kv=on`` prices re-reads free."""
    discounted = profile_with_l2(0.4)
    older = {**discounted, "rows": [r for r in discounted["rows"] if not r.get("prefix_groups")]}
    before = CostModel.fit(source, profile=older, options=POOLED)
    assert before.shared_read_fraction == 1.0 and not before.shared_kv
    off = CostModel.fit(source, profile=discounted,
                        options=CostOptions(profile_mode="pooled", shared_reads=False))
    alike = CostModel.fit(source, profile=profile_with_l2(1.0), options=POOLED)
    for model in (off, alike):
        assert model.fits == before.fits and not model.shared_kv
    free = CostModel.fit(source, profile=discounted,
                         options=CostOptions(profile_mode="pooled", shared_kv=True))
    assert free.shared_read_fraction == 0.0 and free.shared_kv


def test_the_simulator_prices_a_shared_prefix_decode_by_its_distinct_blocks(source) -> None:
    """The same decode over a shared prefix and over private blocks: with a fraction below 1
    the shared one is cheaper by what its re-reads save, with fraction 1 they cost the same."""
    block = SOURCE.kvcache_block_size
    shared = ProfilePoint("decode", 2, (1024,) * 32, prefix_groups=4, prefix_tokens=768)
    private = ProfilePoint("decode", 2, (1024,) * 32)
    rereads = (32 - 4) * 768
    for fraction in (0.4, 1.0):
        model = CostModel.fit(source, profile=profile_with_l2(fraction), options=POOLED)
        times = []
        for point in (shared, private):
            executor = SimExecutor(4000, SimClock(), model, use_graphs=True, block_size=block,
                                   one_off_costs=False)
            times.append(executor.execute(point.batch(block)).duration_s)
            assert executor.prices_stretches == (fraction == 1.0)
        slope = model.fits["decode_graph"].coef
        per_token = slope[FEATURES.index("decode_kv_tokens")] + slope[
            FEATURES.index("decode_context_tokens")]
        assert times[1] - times[0] == pytest.approx((1 - fraction) * per_token * rereads,
                                                    rel=1e-6, abs=1e-12)


def test_a_split_fit_predicts_from_the_unmodified_features() -> None:
    """``split``: a fit of KV read as distinct plus a fraction of the re-reads, stated over the
    two KV features, prices the raw features as the fit priced the moved ones."""
    rng = np.random.default_rng(0)
    x = np.zeros((40, len(FEATURES)))
    context, kv = FEATURES.index("decode_context_tokens"), FEATURES.index("decode_kv_tokens")
    x[:, context] = rng.uniform(1e3, 1e5, 40)
    x[:, kv] = x[:, context] * rng.uniform(0.3, 1.0, 40)
    moved = shared_reads.with_fraction(x, 0.3)
    fit = fit_linear(moved, 1e-3 + 2e-8 * moved[:, kv], ("decode_kv_tokens",))
    stated = shared_reads.split(fit, 0.3)
    assert "decode_context_tokens" in stated.features
    assert np.allclose(stated.predict(x), fit.predict(moved), rtol=1e-12)
    assert shared_reads.split(fit, 1.0) is fit and shared_reads.split(fit, 0.0) is fit


def test_an_older_profiles_shared_rows_are_left_out(source) -> None:
    """A profile taken before each decode ran over its own block tables (no ``decode_tables``)
    ran its shared-prefix rows over an earlier point's private tables: they measure nothing, so
    the model is the one without them, pooled with a newer profile too."""
    discounted = profile_with_l2(0.4)
    assert discounted["decode_tables"] == "own"
    older = {k: v for k, v in discounted.items() if k != "decode_tables"}
    without = {**discounted, "rows": [r for r in discounted["rows"] if not r.get("prefix_groups")]}
    model = CostModel.fit(source, profile=older, options=POOLED)
    assert model.shared_read_fraction == 1.0 and not model.shared_kv
    assert model.fits == CostModel.fit(source, profile=without, options=POOLED).fits
    merged = merge_profiles([discounted, older], ["new", "old"])
    assert "decode_tables" not in merged
    assert "decode_tables" in merge_profiles([discounted, discounted], ["a", "b"])
