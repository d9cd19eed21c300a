"""Session 32: ``replayllm profile`` used as an engineer would (Ctrl-C midway, settings that fit
no step, a budget that times none) and a profile of another model of the same family."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.config import Config
from engine.profiling import load_profile, profile_grid, profile_key, run_profile
from replay.cli.main import main
from replay.whatif.synthetic import LawExecutor, SimClock, StepLaw, law_profile

REPO = Path(__file__).resolve().parents[2]
TINY_TRACE = REPO / "traces" / "cpu-tiny-demo"
SMALL = ["--set", "max_model_len=64", "--set", "max_num_seqs=4",
         "--set", "max_num_batched_tokens=64", "--set", "num_kvcache_blocks=32"]


def test_ctrl_c_midway_keeps_the_points_timed_marked_interrupted(tmp_path: Path) -> None:
    """Before: SIGINT raised KeyboardInterrupt mid-point, "interrupted", exit 130 and minutes of
    timing lost. Now the run stops between two points, writes what it timed (``interrupted``
    in the file) and says so in one line, exit 130."""
    out = tmp_path / "p.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "replay.cli.main", "profile", "--out", str(out),
         "--budget-s", "120"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        for _ in range(3):  # three points timed
            assert proc.stdout.readline(), proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "interrupted (SIGINT): wrote the" in lines[0], err[-2000:]
    profile = load_profile(out)
    assert profile["interrupted"] is True and len(profile["rows"]) >= 3
    assert profile["skipped"] == profile["points"] - len(profile["rows"])


def test_a_stop_between_points_skips_the_rest() -> None:
    config = Config(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128,
                    num_kvcache_blocks=64)
    calls = iter(range(10**6))
    clock = SimClock(0.0)
    executor = LawExecutor(config.num_kvcache_blocks, clock, StepLaw(flush_every=0), 0)
    cut = run_profile(executor, config, float("inf"), 1, clock=lambda: clock.now,
                      stop=lambda: next(calls) >= 2)
    assert len(cut["rows"]) == 2 and cut["interrupted"] is True
    assert cut["skipped"] == cut["points"] - 2
    assert "interrupted" not in law_profile(config)


@pytest.mark.parametrize("argv, needle", [
    # Before: a decode of context 0 reached the runner, a ValueError traceback.
    (["--set", "max_model_len=1", "--budget-s", "20"], None),
    # Before: exit 0 and a profile of 0 rows, which whatif --profile then refused.
    (["--set", "kvcache_block_size=1", "--set", "num_kvcache_blocks=1"],
     "no step shape fits these settings"),
    (["--budget-s", "1e-9"], "--budget-s 1e-09 timed none of the"),
])
def test_settings_that_time_nothing_are_one_line_and_no_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        needle: str | None) -> None:
    out = tmp_path / "p.json"
    code = main(["profile", "--out", str(out), "--quiet", *argv])
    err = capsys.readouterr().err
    if needle is None:  # max_model_len=1: the prefills that fit are timed
        assert code == 0 and load_profile(out)["rows"], err
        return
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not out.exists()


@pytest.mark.parametrize("max_model_len", [1, 2, 3, 100])
def test_no_point_of_the_grid_is_longer_than_max_model_len(max_model_len: int) -> None:
    """The runner's rotary table holds ``max_model_len`` positions (a checkpoint may declare
    10^9): at ``max_model_len=1`` the spread decodes were floored at contexts of 2, past it."""
    config = Config(max_model_len=max_model_len, max_num_seqs=512, max_num_batched_tokens=4096,
                    num_kvcache_blocks=4096)
    for point in profile_grid(config):
        lengths = [new + cached for new, cached in point.prompts] + list(point.decode_contexts)
        assert max(lengths) <= max_model_len, point.label


def test_no_decode_of_context_zero_in_the_grid() -> None:
    config = Config(max_model_len=1, max_num_seqs=4, max_num_batched_tokens=64,
                    num_kvcache_blocks=8)
    assert all(min(p.decode_contexts, default=1) >= 1 for p in profile_grid(config))


def test_a_profile_of_another_model_of_the_family_is_noted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the key named the architecture only, so a Qwen3-0.6B profile priced a tiny-model
    trace (both Qwen3ForCausalLM) without a word. Now the key has the model's shape, and the
    what-if's mismatch note names it."""
    executor = json.loads((TINY_TRACE / "run.json").read_text())["executor"]
    key = profile_key(executor, "v")
    assert key["model"].startswith(f"{executor['model']['num_layers']} layers, hidden ")
    other = {**executor, "model": {**executor["model"], "num_layers": 28, "hidden_size": 1024}}
    profile = law_profile(Config(max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512,
                                 num_kvcache_blocks=64))
    profile["key"] = profile_key(other, key["engine_version"])
    path = tmp_path / "other.profile.json"
    path.write_text(json.dumps(profile))
    assert main(["whatif", str(TINY_TRACE), "--profile", str(path), "--no-plots",
                 "--out", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert "the profile is not of the source's setup: model 28 layers, hidden 1024" in out, out
