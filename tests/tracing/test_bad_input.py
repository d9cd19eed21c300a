"""Bad input: every unreadable trace raises TraceError with one line naming the file at fault."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _trace_helpers import record, reference_like

from tracing import Trace, TraceError, read_trace


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    record(reference_like(6), path, flush_steps=3)
    return path


def _raises(path: Path, names: str, reading: Callable[[Trace], object] | None = None) -> str:
    """Open (and optionally read) ``path``; return the TraceError message after checking it."""
    with pytest.raises(TraceError) as info:
        trace = read_trace(path)
        if reading is not None:
            reading(trace)
    message = str(info.value)
    assert "\n" not in message, message
    assert names in message, message
    # The pyarrow exception must not ride along as context: the CLI prints one line.
    assert info.value.__suppress_context__ or info.value.__context__ is None
    return message


def test_missing_path(tmp_path: Path) -> None:
    """A path that does not exist."""
    assert "no such trace directory" in _raises(tmp_path / "nope", "nope")


def test_file_instead_of_directory(tmp_path: Path) -> None:
    """A file where a trace directory is expected."""
    (tmp_path / "f.parquet").write_bytes(b"x")
    assert "not a trace" in _raises(tmp_path / "f.parquet", "f.parquet")


def test_directory_that_is_not_a_trace(tmp_path: Path) -> None:
    """A directory without run.json."""
    (tmp_path / "d").mkdir()
    assert "no run.json" in _raises(tmp_path / "d", str(tmp_path / "d"))


def _segment(trace_dir: Path, kind: str = "token_sampled", index: int = 1) -> Path:
    return trace_dir / kind / f"seg-{index:06d}.parquet"


def test_segment_of_random_bytes(trace_dir: Path) -> None:
    """A committed segment overwritten with random bytes."""
    seg = _segment(trace_dir)
    seg.write_bytes(os.urandom(seg.stat().st_size))
    assert "not a readable Parquet file" in _raises(trace_dir, str(seg))


def test_truncated_parquet(trace_dir: Path) -> None:
    """A committed segment cut in half (its footer gone)."""
    seg = _segment(trace_dir, "seq_scheduled")
    data = seg.read_bytes()
    seg.write_bytes(data[: len(data) // 2])
    assert "truncated or corrupted" in _raises(trace_dir, str(seg))


def test_truncated_parquet_without_validation(trace_dir: Path) -> None:
    """With validate=False the damage is found, and reported the same way, when the table loads."""
    seg = _segment(trace_dir, "seq_scheduled")
    seg.write_bytes(seg.read_bytes()[:100])
    trace = read_trace(trace_dir, validate=False)
    with pytest.raises(TraceError, match="seg-000001.parquet"):
        trace.table("seq_scheduled")


def test_segment_with_wrong_columns(trace_dir: Path) -> None:
    """A Parquet file of another shape under a committed name: the mismatch is spelled out."""
    seg = _segment(trace_dir)
    rows = pq.read_metadata(seg).num_rows
    table = pa.table(
        {
            "event_id": pa.array(range(rows), pa.int64()),
            "step": pa.array([0] * rows, pa.int64()),
            "token": pa.array([0] * rows, pa.int32()),
        }
    )
    pq.write_table(table, seg)
    message = _raises(trace_dir, str(seg))
    assert "missing columns seq_id, token_id" in message
    assert "unexpected columns token" in message
    assert "step is int64, expected int32" in message


def test_row_count_disagreeing_with_marker(trace_dir: Path) -> None:
    """A valid file holding other rows than its commit marker lists (a swapped file)."""
    shutil.copy(_segment(trace_dir, index=0), _segment(trace_dir, index=1))
    assert "rows, its commit marker says" in _raises(trace_dir, "seg-000001.parquet")


def test_other_schema_version(trace_dir: Path) -> None:
    """run.json of a schema version this release cannot read names it and the readable ones."""
    header_path = trace_dir / "run.json"
    header = json.loads(header_path.read_text())
    header["schema_version"] = 99
    header_path.write_text(json.dumps(header))
    message = _raises(trace_dir, str(header_path))
    assert "schema version 99" in message and "reads versions 1, 2" in message


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "", '{"config": {}}'])
def test_header_not_a_trace_header(trace_dir: Path, text: str) -> None:
    """run.json that is not JSON, not an object, or has no schema_version."""
    (trace_dir / "run.json").write_text(text)
    _raises(trace_dir, str(trace_dir / "run.json"))


def test_corrupt_commit_marker(trace_dir: Path) -> None:
    """A commit marker that is not the JSON the recorder writes."""
    marker = trace_dir / "_commits" / "seg-000000.json"
    marker.write_text('{"segment": 0}')
    assert "malformed commit marker" in _raises(trace_dir, str(marker))


def test_committed_file_missing(trace_dir: Path) -> None:
    """A file a commit marker lists has been deleted."""
    seg = _segment(trace_dir)
    seg.unlink()
    assert "missing" in _raises(trace_dir, str(seg))


def test_summary_not_json(trace_dir: Path) -> None:
    """A damaged summary.json."""
    (trace_dir / "summary.json").write_text("{")
    _raises(trace_dir, "summary.json")


def test_unknown_kind(trace_dir: Path) -> None:
    """Asking for a table that no schema defines lists the kinds that exist."""
    message = _raises(trace_dir, "token_sampled", lambda t: t.table("tokens"))
    assert "unknown event kind 'tokens'" in message


@pytest.mark.parametrize("reading", [
    lambda trace: trace.columns("token_sampled"),
    lambda trace: trace.table("token_sampled"),
])
def test_segment_with_nulls(trace_dir: Path, reading: Callable[[Trace], object]) -> None:
    """A segment of the right schema whose column holds nulls (edited with another tool):
    verify and whatif said `unexpected nulls in a int32 column` (no file named), export was a
    `KeyError: None` traceback and inspect summarised it in silence. Now one line naming the
    file and the column, from every reader of the table."""
    seg = _segment(trace_dir)
    table = pq.read_table(seg)
    index = table.schema.get_field_index("seq_id")
    nulls = pa.array([None] * table.num_rows, table.schema.field(index).type)
    pq.write_table(table.set_column(index, table.schema.field(index), nulls), seg)
    message = _raises(trace_dir, str(seg), reading)
    assert "column seq_id holds nulls" in message
