"""A last commit marker whose ``through_step`` claims steps no committed event belongs to was
edited: ``read_trace`` refuses it in one ``TraceError`` line naming the marker. Before, an
incomplete trace read as "committed through step 1032" and ``verify`` called the cut step's
rows a divergence of the scheduler (exit 1) instead of damage (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.verify import verify
from tests.tracing._trace_helpers import record, reference_like
from tracing import TraceError, read_trace


def _killed_trace(tmp_path: Path) -> Path:
    trace_dir = tmp_path / "t"
    record(reference_like(8), trace_dir, flush_steps=3)
    (trace_dir / "summary.json").unlink()  # as if killed before close
    return trace_dir


def test_through_step_beyond_the_rows_is_refused(tmp_path: Path) -> None:
    """Both the incomplete reading and verify name the edited marker."""
    trace_dir = _killed_trace(tmp_path)
    before = read_trace(trace_dir)
    assert verify(trace_dir).identical
    marker = sorted((trace_dir / "_commits").glob("seg-*.json"))[-1]
    data = json.loads(marker.read_text())
    data["through_step"] += 1000
    marker.write_text(json.dumps(data))
    with pytest.raises(TraceError, match=f"{marker.name}: through_step .*the marker was edited"):
        read_trace(trace_dir)
    with pytest.raises(TraceError, match="the marker was edited"):
        verify(trace_dir)
    assert before.last_step < data["through_step"]


def test_recorded_traces_pass(tmp_path: Path) -> None:
    """Complete and killed traces, and a run that scheduled no step, keep reading."""
    trace_dir = _killed_trace(tmp_path)
    assert read_trace(trace_dir).last_step >= 0
    empty = tmp_path / "empty"
    record(reference_like(0), empty)
    assert read_trace(empty).complete and read_trace(empty).last_step <= 0
