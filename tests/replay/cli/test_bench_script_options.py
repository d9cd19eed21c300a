"""Session 32: the benchmarks' own parsers (``python -m benchmarks.scheduler``, ``.whatif``).
``--repeat 0`` was an AssertionError after a mode ran, ``--flush-steps 0`` and ``--step-ms
-1``/``nan`` a ValueError traceback, and ``--json`` opened for writing whatever it named (a
checkpoint's config.json was overwritten): now argparse's one line, exit 2, before any work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("suite, argv, needle", [
    ("scheduler", ["--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
    ("scheduler", ["--flush-steps", "0"], "argument --flush-steps: must be >= 1, got 0"),
    ("scheduler", ["--step-ms", "nan"], "argument --step-ms: must be a finite number >= 0"),
    ("scheduler", ["--step-ms", "-1"], "argument --step-ms: must be a finite number >= 0"),
    ("scheduler", ["--json", ""], "argument --json: an empty file name"),
    ("whatif", ["--repeat", "-2"], "argument --repeat: must be >= 1, got -2"),
])
def test_odd_options_are_one_line_before_any_work(suite: str, argv: list[str],
                                                  needle: str) -> None:
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{suite}", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and needle in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not done.stdout


@pytest.mark.parametrize("suite", ["scheduler", "whatif"])
def test_json_never_writes_over_a_file_it_did_not_write(tmp_path: Path, suite: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    config.write_text('{"not": "a benchmark result"}')
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{suite}", "--json", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "argument --json:" in done.stderr, done.stderr[-2000:]
    assert config.read_text() == '{"not": "a benchmark result"}'
