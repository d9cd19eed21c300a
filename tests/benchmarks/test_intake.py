"""benchmarks/intake.py times LLM.add_request on the embedded tiny model."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.intake import main, time_intake


def test_intake_times_every_add_and_writes_its_rows(tmp_path: Path) -> None:
    row = time_intake(64, 5)
    assert row["prompt_tokens"] == 64 and row["requests"] == 5
    assert 0 < row["median_s"] < 1 and 0 < row["mean_s"] < 1
    out = tmp_path / "intake.json"
    assert main(["--lengths", "16,300", "--requests", "3", "--json", str(out)]) == 0
    assert [r["prompt_tokens"] for r in json.loads(out.read_text())] == [16, 300]
