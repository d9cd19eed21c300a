"""``whatif TRACE --timing-from OTHER`` works out its timing note (``notes.timing_note``) once:
the line it prints and the recorded row's note in summary.parquet are the same computation."""

from __future__ import annotations

import pandas as pd
import pytest
from _cli import REPO, SAMPLE, run_cli

import replay.whatif.notes as notes

H200 = str(REPO / "traces" / "h200-reference")


def test_the_timing_note_is_computed_once_and_used_twice(tmp_path, monkeypatch:
                                                         pytest.MonkeyPatch) -> None:
    calls = []
    real = notes.timing_note

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(notes, "timing_note", counted)
    out = tmp_path / "w"
    code, text, err = run_cli(["whatif", H200, "--timing-from", str(SAMPLE), "--out", str(out),
                               "--no-plots"])
    assert code == 0, err
    assert len(calls) == 1
    (line,) = [x for x in text.splitlines() if x.startswith("note: --timing-from")]
    summary = pd.read_parquet(out / "summary.parquet").set_index("variant")
    assert line.removeprefix("note: ") in summary.loc["recorded", "notes"]
