"""``pytest --replayllm-traces DIR`` over a directory holding damaged traces.

Each damaged trace is one failing case in one line (no traceback), the intact one passes, and
a directory that merely is named ``run.json`` is no trace. Before: such a directory became a
case of its parent, failing with "not a trace directory (no run.json)" beside a ``run.json``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from replay.testing.pytest_plugin import find_traces

pytest_plugins = ["pytester"]
SAMPLE = Path(__file__).resolve().parents[3] / "traces" / "cpu-tiny-demo"


def test_a_directory_named_run_json_is_no_trace(tmp_path: Path) -> None:
    shutil.copytree(SAMPLE, tmp_path / "good")
    (tmp_path / "notes" / "run.json").mkdir(parents=True)
    assert find_traces(tmp_path) == [tmp_path / "good"]


def test_damaged_traces_fail_one_line_each(pytester: pytest.Pytester) -> None:
    root = pytester.path / "traces dir ü"
    shutil.copytree(SAMPLE, root / "good")
    shutil.copytree(SAMPLE, root / "bad-header")
    (root / "bad-header" / "run.json").write_text("{not json")
    shutil.copytree(SAMPLE, root / "truncated")
    segment = sorted((root / "truncated" / "seq_scheduled").iterdir())[0]
    segment.write_bytes(segment.read_bytes()[:100])
    (root / "good" / "sub" / "run.json").mkdir(parents=True)
    result = pytester.runpytest("-p", "replay.testing.pytest_plugin", "--replayllm-traces",
                                str(root))
    result.assert_outcomes(passed=1, failed=2)
    text = result.stdout.str()
    assert "Traceback" not in text
    assert "trace header is not valid JSON" in text
    assert "not a readable Parquet file" in text
