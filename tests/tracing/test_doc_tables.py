"""docs/trace-format.md describes what a recorder writes: each event kind's column table lists
the file's columns in the file's order with their types (pandas and duckdb hand them back in
that order; the reader refuses a file whose columns are out of order), and every field of
``run.json``, ``summary.json`` and its ``recorder`` object is named. Before, the doc listed
``model_step.outside_s`` before ``padded_tokens`` and left ``recorder.write_cpu_s`` (and the
recorder's ``background``, ``writer`` and ``fsync``) out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq

from tests.tracing._trace_helpers import record, reference_like
from tracing.schema import EVENT_COLUMNS, EVENT_KINDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "trace-format.md"


def _doc_columns() -> dict[str, list[tuple[str, str]]]:
    """Each ``### kind: ...`` section's column table, as (name, type) rows in order."""
    text = DOC.read_text(encoding="utf-8")
    tables = {}
    for section in re.split(r"^### ", text, flags=re.M)[1:]:
        name = section.split(":", 1)[0].strip()
        rows = re.findall(r"^\| `([a-z_]+)` \| ([a-z0-9<>]+) \|", section, flags=re.M)
        if name in EVENT_COLUMNS:
            tables[name] = rows
    return tables


def test_column_tables_match_the_files_in_order(tmp_path: Path) -> None:
    """Every kind's documented columns are the written file's, in order, after the two shared
    ones (``event_id``, ``step``), with the schema's types."""
    trace_dir = tmp_path / "t"
    record(reference_like(6), trace_dir)
    documented = _doc_columns()
    assert set(documented) == set(EVENT_KINDS)
    for kind in EVENT_KINDS:
        assert documented[kind] == list(EVENT_COLUMNS[kind].items()), kind
        written = pq.read_schema(next((trace_dir / kind).glob("seg-*.parquet"))).names
        assert written == ["event_id", "step", *(n for n, _ in documented[kind])], kind


def test_header_and_summary_fields_are_named(tmp_path: Path) -> None:
    """Each top-level field of the header and the summary, and of the summary's ``recorder``,
    appears in the doc as `field` (or `field: value`)."""
    trace_dir = tmp_path / "t"
    record(reference_like(4), trace_dir)
    text = DOC.read_text(encoding="utf-8")
    header = json.loads((trace_dir / "run.json").read_text())
    summary = json.loads((trace_dir / "summary.json").read_text())
    fields = [*header, *summary, *summary["recorder"]]
    missing = [f for f in fields if not re.search(f"`{f}(`|: )", text)]  # `complete: true`
    assert not missing, f"undocumented fields: {missing}"
