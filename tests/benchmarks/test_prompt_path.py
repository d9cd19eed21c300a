"""benchmarks/prompt_path.py times each stage of a prompt token's host path, and with
``--compare REV`` the same on another revision's engine, in one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.prompt_path import main, time_prompt_path

STAGES = ("add_ns", "stage_ns", "prefill_ns", "young_gc_ns", "full_gc_ns")


def test_every_stage_is_timed_per_prompt_token() -> None:
    row = time_prompt_path(300, 6)
    assert row["prompt_tokens"] == 300 and row["requests"] == 6
    assert all(0 <= row[name] < 1e6 for name in STAGES)
    assert row["add_ns"] > 0 and row["stage_ns"] > 0 and row["prefill_ns"] > 0


def test_compare_measures_another_revisions_engine_beside_this_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    assert main(["--lengths", "64", "--requests", "3", "--rounds", "1", "--compare", "HEAD",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["engine"] for r in rows] == ["this tree", "HEAD"]
    assert all(r["prompt_tokens"] == 64 for r in rows)
    assert "| HEAD | 0 | 64 |" in capsys.readouterr().out
