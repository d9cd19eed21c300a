"""Several device profiles of one setup pooled (``replay.whatif.cost.profile.merge_profiles``).

What these tests prove:
- each point is timed by the median over the profiles that timed it, so one profile's slow row
  (a launch-bound eager step in a busy host state) does not move the pooled profile;
- a point only some profiles timed keeps what they timed, and says how many did;
- profiles of different setups are refused with one clear error;
- ``--profile A,B,C`` (``read_profile``) pools the files, and a model fits on the pool.
"""

from __future__ import annotations

import copy

import pytest

from engine.config import Config
from engine.profiling import ProfileError, save_profile
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.options import CostOptions
from replay.whatif.cost.profile import merge_profiles, read_profile
from replay.whatif.synthetic import StepLaw, law_profile, record_workload
from replay.workloads.builtin import reference_workload

LAW = StepLaw(noise=0.0, flush_every=0)
DEVICE = Config(max_model_len=2048, max_num_seqs=128, max_num_batched_tokens=4096,
                num_kvcache_blocks=8000)


@pytest.fixture(scope="module")
def profile() -> dict:
    return law_profile(DEVICE, LAW, budget_s=5.0)


def _scaled(profile: dict, factor: float, rows: slice = slice(None)) -> dict:
    out = copy.deepcopy(profile)
    for row in out["rows"][rows]:
        for name in ("interval_s", "duration_s"):
            row[name] *= factor
    return out


def test_each_point_is_the_median_of_its_timings(profile) -> None:
    slow = _scaled(profile, 1.5, slice(0, 3))  # one profile's first rows timed slow
    merged = merge_profiles([profile, slow, _scaled(profile, 1.01)], ["a", "b", "c"])
    assert len(merged["rows"]) == len(profile["rows"])
    first, later = merged["rows"][0], merged["rows"][5]
    assert first["duration_s"] == pytest.approx(profile["rows"][0]["duration_s"] * 1.01)
    assert later["duration_s"] == pytest.approx(profile["rows"][5]["duration_s"] * 1.0)
    assert first["profiles"] == 3 and merged["merged_from"] == ["a", "b", "c"]


def test_a_point_only_some_profiles_timed_keeps_their_timing(profile) -> None:
    fewer = copy.deepcopy(profile)
    fewer["rows"] = fewer["rows"][1:]
    merged = merge_profiles([profile, fewer], ["a", "b"])
    lone = next(r for r in merged["rows"] if r["label"] == profile["rows"][0]["label"]
                and r["graph_used"] == profile["rows"][0]["graph_used"])
    assert lone["profiles"] == 1 and lone["duration_s"] == profile["rows"][0]["duration_s"]


def test_profiles_of_different_setups_are_refused(profile) -> None:
    other = copy.deepcopy(profile)
    other["key"] = {**(other.get("key") or {}), "dtype": "float16"}
    with pytest.raises(ProfileError, match="different setups"):
        merge_profiles([profile, other], ["a", "b"])


def test_comma_separated_profiles_are_pooled_and_fitted(profile, tmp_path) -> None:
    paths = []
    for i, factor in enumerate((1.0, 1.2, 1.02)):
        paths.append(str(tmp_path / f"p{i}.json"))
        save_profile(_scaled(profile, factor), paths[-1])
    pooled, name = read_profile(",".join(paths))
    assert name == ",".join(paths) and pooled["merged_from"] == paths
    # Spaces around the commas (a shell user's "a.json, b.json") name the same files.
    assert read_profile(" , ".join(paths))[0]["merged_from"] == paths
    assert pooled["rows"][0]["duration_s"] == pytest.approx(profile["rows"][0]["duration_s"]
                                                            * 1.02)
    source = record_workload(Config(num_kvcache_blocks=2000, max_num_seqs=64),
                             reference_workload()[:32], LAW)
    model = CostModel.fit(source, profile=",".join(paths),
                          options=CostOptions(profile_mode="pooled"))
    assert model.prior is not None and model.prior.path == ",".join(paths)
