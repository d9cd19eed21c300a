"""A committed segment file replaced by a copy of another segment's file (same kind, same row
count: the marker's counts and the file's schema all agree) is damage, refused in one
``TraceError`` line naming the file, never read as this segment's events: before, ``verify``
called it a divergence of the scheduler (exit 1, its report showing no differing column) and
``inspect`` a complete trace."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from replay.verify import verify
from tests.tracing._trace_helpers import record, reference_like
from tracing import TraceError, read_trace


def _copy_over(trace_dir: Path, kind: str) -> Path:
    """Copy ``kind``'s file of one segment over the next segment's, of equal row count."""
    trace = read_trace(trace_dir)
    files = {f.segment: f for seg in trace.segment_list() for f in seg.files if f.kind == kind}
    for index in sorted(files):
        nxt = files.get(index + 1)
        if nxt is not None and nxt.rows == files[index].rows and files[index].rows:
            shutil.copyfile(files[index].path, nxt.path)
            return nxt.path
    raise AssertionError(f"no two consecutive {kind} files of equal rows")


@pytest.mark.parametrize("kind", ["batch_scheduled", "model_step"])
def test_a_file_copied_from_another_segment_is_refused(tmp_path: Path, kind: str) -> None:
    """Every reader (validated open, deferred validation, verify) names the copied file."""
    trace_dir = tmp_path / "t"
    record(reference_like(8), trace_dir, flush_steps=1)
    assert verify(trace_dir).identical
    copied = _copy_over(trace_dir, kind)
    with pytest.raises(TraceError, match=f"{copied.name}.*outside segment"):
        read_trace(trace_dir)
    lazy = read_trace(trace_dir, validate=False)
    with pytest.raises(TraceError, match="outside segment"):
        lazy.table(kind)
    with pytest.raises(TraceError, match="outside segment"):
        lazy.columns(kind)
    with pytest.raises(TraceError, match="a file of another segment or trace was copied"):
        verify(trace_dir)


def test_untouched_traces_still_read(tmp_path: Path) -> None:
    """The check passes every file a recorder wrote, complete or cut at any segment."""
    trace_dir = tmp_path / "t"
    record(reference_like(8), trace_dir, flush_steps=2)
    whole = read_trace(trace_dir)
    assert whole.complete and whole.num_events > 0
    (trace_dir / "summary.json").unlink()
    cut = read_trace(trace_dir)
    assert cut.num_events <= whole.num_events and verify(trace_dir).identical
