"""A header edited to an older schema version is refused in one ``TraceError`` line, never a
silent "identical": verify compares ``request_finished.error`` only from version 5 on
(``COMPARED_SINCE``), so a version-7 trace whose header said 4 verified identical though its
``error`` column had been changed. Now a file holding a column added after the header's
version, or a ``summary.json`` whose ``schema_version`` is not the header's, is damage. Older
files lacking later columns still read (filled as before)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.verify import verify
from tests.tracing._trace_helpers import record, reference_like
from tracing import TraceError, read_trace


def _set_version(trace_dir: Path, version: int, file: str = "run.json") -> None:
    path = trace_dir / file
    data = json.loads(path.read_text())
    data["schema_version"] = version
    path.write_text(json.dumps(data))


def _corrupt_error_column(trace_dir: Path) -> None:
    """Give the first finished request an ``error`` it never had (rows and ids unchanged)."""
    path = next((trace_dir / "request_finished").glob("seg-*.parquet"))
    table = pq.read_table(path)
    errors = table.column("error").to_pylist()
    errors[0] = "made up"
    index = table.schema.get_field_index("error")
    table = table.set_column(index, table.schema.field(index), pa.array(errors, pa.string()))
    pq.write_table(table, path)


def test_header_edited_older_hides_no_corruption(tmp_path: Path) -> None:
    """The corrupted column diverges under its own version and is refused under an older one."""
    trace_dir = tmp_path / "t"
    record(reference_like(6), trace_dir, flush_steps=4)
    _corrupt_error_column(trace_dir)
    assert not verify(trace_dir).identical
    _set_version(trace_dir, 4)
    _set_version(trace_dir, 4, "summary.json")
    with pytest.raises(TraceError, match="schema of version 4 .*unexpected columns"):
        verify(trace_dir)
    with pytest.raises(TraceError, match="request_finished schema.*unexpected columns error"):
        read_trace(trace_dir, validate=False).table("request_finished")


def test_summary_version_must_match_the_header(tmp_path: Path) -> None:
    """Header and summary are written with one version: a difference is an edit."""
    trace_dir = tmp_path / "t"
    record(reference_like(4), trace_dir)
    _set_version(trace_dir, 6, "summary.json")
    with pytest.raises(TraceError, match="summary.json: schema_version 6, but run.json says 7"):
        read_trace(trace_dir)


def test_older_files_without_later_columns_still_read(tmp_path: Path) -> None:
    """A version-4 trace's files lack the version-5 and -7 columns: read, filled as before."""
    trace_dir = tmp_path / "t"
    record(reference_like(4), trace_dir)
    late = {"request_added": ["top_p", "top_k", "seed", "stop", "priority", "added_s"],
            "model_step": ["outside_s"], "request_finished": ["error"]}
    for kind, names in late.items():
        for path in (trace_dir / kind).glob("seg-*.parquet"):
            pq.write_table(pq.read_table(path).drop_columns(names), path)
    _set_version(trace_dir, 4)
    _set_version(trace_dir, 4, "summary.json")
    trace = read_trace(trace_dir)
    assert set(trace.df("request_finished")["error"]) == {""}
    assert trace.df("request_added")["priority"].eq(0).all()
    assert verify(trace_dir).identical
