"""Trace JSON of the wrong type: a TraceError naming the file and the field, before any reader
formats or looks up a value (``tracing.validate``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tracing import TraceError, read_trace

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "cpu-tiny-demo"


def _copy_with(tmp_path: Path, name: str, edit: dict, under: str | None = None) -> Path:
    trace = tmp_path / "t"
    shutil.copytree(SAMPLE, trace)
    data = json.loads((trace / name).read_text())
    (data[under] if under else data).update(edit)
    (trace / name).write_text(json.dumps(data))
    return trace


@pytest.mark.parametrize("under, field, value", [
    (None, "model", "x"),          # was: whatif AttributeError ('str' has no attribute 'get')
    (None, "git_commit", 7),       # was: inspect TypeError ('int' is not subscriptable)
    (None, "device", ["cuda"]),
    ("executor", "executor", []),  # was: whatif TypeError (unhashable type: 'list')
    ("executor", "model", 3),
])
def test_header_fields_of_the_wrong_type(tmp_path: Path, under: str | None, field: str,
                                         value: object) -> None:
    """A header field a reader uses as text or as an object, of another type: one line."""
    trace = _copy_with(tmp_path, "run.json", {field: value}, under)
    with pytest.raises(TraceError, match=f"run.json: .*{field} must be"):
        read_trace(trace)


@pytest.mark.parametrize("value", ["2", -1, 1.5, True])
def test_summary_segments_of_the_wrong_type(tmp_path: Path, value: object) -> None:
    """summary.json's segment count must be an integer >= 0 (it decides completeness)."""
    trace = _copy_with(tmp_path, "summary.json", {"segments": value})
    with pytest.raises(TraceError, match="summary.json: segments must be an integer"):
        read_trace(trace)


def test_summary_counting_more_segments_than_committed(tmp_path: Path) -> None:
    """A clean close commits every segment before writing the summary: a summary counting more
    segments than have markers is damage, not an incomplete trace."""
    trace = _copy_with(tmp_path, "summary.json", {"segments": 99})
    with pytest.raises(TraceError, match="closed with 99 committed segments, but 2"):
        read_trace(trace)
