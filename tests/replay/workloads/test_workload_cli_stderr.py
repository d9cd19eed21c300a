"""``replayllm workload generate|import|describe`` keep a redirected or captured stderr for
their own lines: a failed import's stderr is its one error line, a good one's is empty. The
progress bars were drawn whatever stderr was, so a log held the bar's redraws (``\\rimport: 0
req [00:00, ? req/s]...``) before the error line; ``run`` and ``whatif --stream`` draw theirs
only on a terminal, and the workload commands now do too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from replay.cli.main import main

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_a_failed_import_writes_one_line_to_a_captured_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rows read before the bad one drew no bar: stderr is the error line and nothing else."""
    trace = tmp_path / "t.csv"
    trace.write_text(AZURE + "2023-11-16 18:17:03,100,10\n2023-11-16 18:17:02,100,10\n")
    assert main(["workload", "import", str(trace), "--format", "azure",
                 "--out", str(tmp_path / "w.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\r" not in err
    assert err.startswith(f"replayllm workload: error: {trace}:3: arrives 1 s before")


def test_good_commands_leave_a_captured_stderr_empty(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """generate, import and describe print their summaries on stdout and nothing on stderr."""
    out = tmp_path / "g.jsonl"
    assert main(["workload", "generate", "--num-requests", "20", "--out", str(out)]) == 0
    assert main(["workload", "import", str(out), "--format", "replayllm",
                 "--out", str(tmp_path / "i.parquet")]) == 0
    assert main(["workload", "describe", str(tmp_path / "i.parquet")]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "wrote 20 requests" in captured.out and "requests               20" in captured.out


def test_a_terminal_still_gets_the_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the bar is drawn, as before."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["workload", "generate", "--num-requests", "5",
                 "--out", str(tmp_path / "g.jsonl")]) == 0
    assert "generate: " in capsys.readouterr().err
