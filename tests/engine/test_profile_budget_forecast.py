"""``replayllm profile`` keeps its budget: a point is forecast from the points of its class
already timed (``engine.profile_forecast.CostForecast``) and skipped where it would end past the
budget, while a GPU profile far from its budget times the same points as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import Config
from engine.profile_forecast import CostForecast
from engine.profiling import ProfilePoint, profile_grid, run_profile
from replay.whatif.synthetic import LawExecutor, SimClock, StepLaw

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted((REPO / "traces" / "profiles").glob("*.profile.json"))
# A CPU-like law: a prompt's attention grows with its length squared (tiny model on 2 cores:
# 8192 tokens in one prompt ~7 s a run, 32768 ~16x that).
QUADRATIC = StepLaw(flush_every=0, noise=0.0, per_attn_work_s=1e-7)
LONG = Config(max_model_len=32768, max_num_seqs=512, max_num_batched_tokens=32768,
              num_kvcache_blocks=60000)


def _profile(budget_s: float, progress: list[str] | None = None) -> dict:
    clock = SimClock(0.0)
    executor = LawExecutor(LONG.num_kvcache_blocks, clock, QUADRATIC, 0)
    return run_profile(executor, LONG, budget_s, 3, clock=lambda: clock.now,
                       progress=None if progress is None else progress.append)


def test_a_point_forecast_past_the_budget_is_skipped_not_timed() -> None:
    """Before: the estimate was the kind's last point scaled by tokens, so 32768 tokens in one
    prompt was priced from 8192 in 16 (x4, not the x64 its attention costs): with 60 s of
    budget it was timed and the run ended at ~245 s. Now it is forecast from 8192 in one
    prompt (x16 its attention), skipped, and the run ends within the budget."""
    budget = 60.0
    notes: list[str] = []
    cut = _profile(budget, notes)
    labels = {r["label"] for r in cut["rows"]}
    assert "prefill 8192 in 1" in labels and "prefill 32768 in 1" not in labels
    assert cut["elapsed_s"] <= budget, cut["elapsed_s"]
    assert cut["skipped"] == cut["points"] - len(cut["rows"]) > 0
    # The note: which point, what it was forecast to take, what was left.
    note = next(n for n in notes if n.startswith("prefill 32768 in 1:"))
    assert "skipped, forecast" in note and "of the budget left" in note, note
    assert sum(": skipped, forecast " in n for n in notes) <= cut["skipped"]
    assert sum(n.startswith("budget spent: the ") for n in notes) <= 1  # not a line a point


def test_without_a_binding_budget_every_point_is_timed() -> None:
    full = _profile(float("inf"))
    assert full["skipped"] == 0 and len(full["rows"]) == full["points"]
    assert any(r["label"] == "prefill 32768 in 1" for r in full["rows"])


def test_the_forecast_bounds_a_long_prompt_by_its_attention() -> None:
    """Each sort of work scales on its own: the least bound over the timed points of the class
    (32768 tokens in one prompt: x16 the attention of 8192 in one, not x4 its tokens); nothing
    of a class timed (the first point of a kind, or its first eager copy): no forecast."""
    def prefill(tokens: int, count: int, eager: bool = False) -> ProfilePoint:
        each = tokens // count
        return ProfilePoint("prefill", 0, prompts=((each, 0),) * count, eager=eager)

    forecast = CostForecast()
    assert forecast.seconds_per_run(prefill(16, 1)) is None
    forecast.record(prefill(8192, 1), 1.0)
    forecast.record(prefill(8192, 16), 0.1)
    assert forecast.seconds_per_run(prefill(32768, 1)) == pytest.approx(16.0)
    assert forecast.seconds_per_run(prefill(2048, 1)) == pytest.approx(0.1)  # the same attention
    assert forecast.seconds_per_run(prefill(8192, 1, eager=True)) is None
    assert forecast.seconds_per_run(ProfilePoint("decode", 0, (128,))) is None
    forecast.record(ProfilePoint("decode", 0, (128,)), 0.01)
    # A decode of 8 rows: x8 its rows; a spread one is bounded by its longest row too.
    assert forecast.seconds_per_run(ProfilePoint("decode", 0, (128,) * 8)) == pytest.approx(0.08)
    assert forecast.seconds_per_run(ProfilePoint("decode", 2, (16, 48, 128, 320))) == \
        pytest.approx(0.04)


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_the_committed_gpu_profiles_would_skip_no_point(path: Path) -> None:
    """The H100/H200 profiles ran 20-28 s of a 170 s budget and timed every point; replayed in
    their order, their own timings (each run's share of ``elapsed_s``) forecast no point past
    that budget, so a GPU profile times the same points as before."""
    profile = json.loads(path.read_text())
    grid = {p.label: p for p in profile_grid(Config(**profile["config"]), lambda p: True)}
    runs = sum((r["repeats"] + 1) * r["interval_s"] for r in profile["rows"])
    per_run = profile["elapsed_s"] / runs  # the overhead between runs shared out
    forecast, spent = CostForecast(), 0.0
    assert profile["skipped"] == 0
    for row in profile["rows"]:
        point = grid[row["label"]]
        assert (point.kind, point.eager) == (row["kind"], row["eager"])
        seconds = forecast.seconds_per_run(point)
        estimate = (profile["repeats"] + 1) * (seconds or 0.0)
        assert spent + estimate <= profile["budget_s"], (row["label"], estimate)
        forecast.record(point, row["interval_s"] * per_run)
        spent += (row["repeats"] + 1) * row["interval_s"] * per_run
