"""A profile missing a step kind says what prices those steps, and counts every step.

Under ``profile_mode=profile`` or ``blend`` the first note says how many steps the source's
fits and the profile's price. With a profile of no decode rows (or too few to fit), the
source's fits priced every decode step, yet the note said ``the source's fits on 0 steps``
(profile mode keeps no source range, so each step counted as neither) and ``N decode steps lie
outside both the source's and the profile's range: extrapolated``, of the source's own steps,
priced by the fit made of them. The note now counts what prices each step (``prices``) and says
that the profile has no fit of those steps.
"""

from __future__ import annotations

import re

import pytest

from engine.config import Config
from replay.whatif.cost.features import feature_matrix
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.options import CostOptions
from replay.whatif.synthetic import StepLaw, law_profile, record_workload
from replay.workloads.builtin import reference_workload

LAW = StepLaw(noise=0.0, flush_every=0)
SOURCE = Config(num_kvcache_blocks=2000, max_num_seqs=64)
DEVICE = Config(max_model_len=4096, max_num_seqs=512, max_num_batched_tokens=32768,
                num_kvcache_blocks=60000)


@pytest.fixture(scope="module")
def source():
    return record_workload(SOURCE, reference_workload()[:32], LAW)


@pytest.fixture(scope="module")
def no_decodes() -> dict:
    profile = law_profile(DEVICE, LAW, budget_s=0.5)
    return {**profile, "rows": [r for r in profile["rows"] if r["kind"] != "decode"]}


@pytest.mark.parametrize("mode", ["profile", "blend"])
def test_every_step_is_counted_by_what_prices_it(source, no_decodes, mode: str) -> None:
    """The first note's two counts add up to the steps, the profile's being the steps its
    fits price; no decode step is the profile's."""
    model = CostModel.fit(source, profile=no_decodes, options=CostOptions(profile_mode=mode))
    x, classes = feature_matrix(source)
    lines = model.prior.warnings(x, classes)
    counts = re.match(r"priced by the source's fits on (\d+) steps and the profile .* on (\d+)$",
                      lines[0])
    assert counts is not None, lines[0]
    by_source, by_profile = int(counts[1]), int(counts[2])
    assert by_source + by_profile == len(classes)
    decodes = [i for i, c in enumerate(classes.astype(str)) if c.startswith("decode")]
    assert decodes
    assert not any(model.prior.prices(str(classes[i]), x[i].tolist()) for i in decodes)
    assert by_source >= len(decodes)


def test_profile_mode_says_the_profile_has_no_fit_of_a_kind(source, no_decodes) -> None:
    """Profile mode: the decode steps are said to be priced by the source's fits, the profile
    having none of them, not to lie outside both ranges."""
    model = CostModel.fit(source, profile=no_decodes, options=CostOptions(profile_mode="profile"))
    x, classes = feature_matrix(source)
    lines = model.prior.warnings(x, classes)
    decode_lines = [line for line in lines if " decode" in line.split(":")[0]]
    assert decode_lines, lines
    assert all("the profile has no fit of" in line and "outside both" not in line
               for line in decode_lines), decode_lines
