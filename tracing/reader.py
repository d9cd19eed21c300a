"""Reading a trace directory: ``read_trace(path) -> Trace``.

Only committed segments are read (a segment is committed once its marker in ``_commits/``
exists); temporary and unlisted files are ignored, so the trace of a killed process reads as the
prefix it managed to commit: steps 0 to ``last_step``, whose rows are all its tables hold (its
last segment may also hold the first rows of the step after, which no table returns). Every
problem with the files raises ``TraceError`` with one line naming the file, never a pyarrow
traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tracing.commits import (
    PARQUET_ERRORS,
    Commits,
    Segment,
    SegmentFile,
    UnreadTail,
    committed_segments,
    is_present,
    load_json,
)
from tracing.convert import column_to_python
from tracing.errors import TraceError, one_line
from tracing.layout import HEADER_FILE, SUMMARY_FILE
from tracing.schema import (
    ADDED_COLUMN_DEFAULTS,
    EVENT_KINDS,
    arrow_schema,
    column_types,
)
from tracing.segment_checks import open_checked, validate_files
from tracing.validate import check_header, check_summary, check_summary_figures

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Segment", "SegmentFile", "Trace", "read_trace"]


class Trace:
    """A recorded trace (open it with ``read_trace``). Tables load on first use and are cached.

    ``complete`` is True when the recording closed cleanly (``summary.json`` present and every
    segment it counts committed); ``last_step`` is the last step whose events are all in the
    committed segments (-1 if none). An incomplete trace's tables, counts and event stream hold
    only the rows of steps 0 to ``last_step`` (``tracing.commits.Commits``): the prefix
    ``verify`` checks, the same rows for every reader (``inspect``, the exports, ``whatif``).
    """

    def __init__(
        self,
        path: Path,
        header: dict[str, Any],
        summary: dict[str, Any] | None,
        segments: list[Segment],
        unread: UnreadTail | None = None,
    ) -> None:
        self.path = path
        self.header = header
        self.summary = summary
        # Committed segments left unread: a copy taken mid-recording lacks their files.
        self.unread = unread
        self._commits = Commits(segments, summary)
        self._version = header.get("schema_version")  # read_trace checked it
        self._tables: dict[str, pa.Table] = {}

    # --- shape ------------------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return self._commits.complete

    @property
    def last_step(self) -> int:
        return self._commits.last_step

    @property
    def segments(self) -> int:
        """How many committed segments the trace has."""
        return len(self._commits.segments)

    @property
    def unread_note(self) -> str | None:
        """One line saying which committed segments were not read and why (``UnreadTail``),
        or None when every committed segment was."""
        return self.unread.describe(self.last_step) if self.unread is not None else None

    def segment_list(self) -> list[Segment]:
        return list(self._commits.segments)

    def counts(self) -> dict[str, int]:
        """Rows per event kind in ``table(kind)``: the commit markers' counts (reads no data),
        for an incomplete trace less the rows of steps after ``last_step``."""
        return self._commits.counts()

    @property
    def kinds(self) -> tuple[str, ...]:
        """Event kinds with at least one row, in schema order."""
        counts = self.counts()
        return tuple(kind for kind in EVENT_KINDS if counts[kind])

    @property
    def num_events(self) -> int:
        return sum(self.counts().values())

    @property
    def size_bytes(self) -> int:
        """Bytes of the committed Parquet files (under whichever name each has: the writer of a
        trace being recorded renames them as it goes)."""
        return self._commits.size_bytes()

    def __repr__(self) -> str:
        state = "complete" if self.complete else f"incomplete, through step {self.last_step}"
        if self.unread is not None:
            state += f", segments {self.unread.first} to {self.unread.last} unread"
        return (
            f"Trace({str(self.path)!r}, "
            f"{self.segments} segments, {self.num_events} events, {state})"
        )

    # --- data -------------------------------------------------------------------------------------
    def table(self, kind: str) -> pa.Table:
        """Every committed row of ``kind`` in event_id order, typed as in ``EVENT_COLUMNS``
        (for an incomplete trace, of steps 0 to ``last_step`` only)."""
        if kind not in EVENT_KINDS:
            raise TraceError(f"unknown event kind {kind!r}; kinds: {', '.join(EVENT_KINDS)}")
        cached = self._tables.get(kind)
        if cached is not None:
            return cached
        schema = arrow_schema(kind)
        parts = [_read_file(f, self._version) for f in self._commits.files(kind)]
        table = pa.concat_tables(parts) if parts else schema.empty_table()
        table = table.combine_chunks()
        if table.num_rows > 1:
            ids = table.column("event_id").to_numpy()
            if not (np.diff(ids) > 0).all():
                table = table.sort_by("event_id")
        table = self._commits.prefix_table(table)
        self._tables[kind] = table
        return table

    def columns(self, kind: str) -> dict[str, np.ndarray | list]:
        """``table(kind)`` as column name -> numpy array (list columns: lists), event_id order.

        Built straight from the Parquet buffers, never through pandas: what ``verify`` reads.
        """
        if kind not in EVENT_KINDS:
            raise TraceError(f"unknown event kind {kind!r}; kinds: {', '.join(EVENT_KINDS)}")
        types = column_types(kind)
        parts = [_read_file(f, self._version) for f in self._commits.files(kind)]
        if not parts:
            parts = [arrow_schema(kind).empty_table()]
        cols = {
            name: pa.chunked_array(
                [chunk for part in parts for chunk in part.column(name).chunks],
                type=parts[0].schema.field(name).type,
            )
            for name in types
        }
        cols = {name: column_to_python(cols[name], types[name]) for name in types}
        ids = cols["event_id"]
        if len(ids) > 1 and not (np.diff(ids) > 0).all():
            order = np.argsort(ids, kind="stable")
            cols = {
                name: [v[i] for i in order] if isinstance(v, list) else v[order]
                for name, v in cols.items()
            }
        return self._commits.prefix_columns(cols)

    def df(self, kind: str) -> pd.DataFrame:
        """``table(kind)`` as a pandas DataFrame."""
        return self.table(kind).to_pandas()

    def events(self) -> pa.Table:
        """The whole event stream in emission order: ``event_id``, ``step``, ``kind``, ``row``.

        ``row`` indexes the event's row in ``table(kind)``, so the full event is one lookup away.
        """
        ids, steps, kinds, rows = [], [], [], []
        for code, kind in enumerate(EVENT_KINDS):
            t = self.table(kind)
            ids.append(t.column("event_id").to_numpy())
            steps.append(t.column("step").to_numpy())
            kinds.append(np.full(t.num_rows, code, dtype=np.int8))
            rows.append(np.arange(t.num_rows, dtype=np.int64))
        event_id = np.concatenate(ids)
        order = np.argsort(event_id, kind="stable")
        kind_column = pa.DictionaryArray.from_arrays(
            pa.array(np.concatenate(kinds)[order]), pa.array(list(EVENT_KINDS))
        )
        return pa.table(
            {
                "event_id": event_id[order],
                "step": np.concatenate(steps)[order],
                "kind": kind_column,
                "row": np.concatenate(rows)[order],
            }
        )


def _read_file(f: SegmentFile, version: int | None) -> pa.Table:
    pf = open_checked(f, version)
    try:
        table = pf.read()
    except PARQUET_ERRORS as exc:
        raise TraceError(f"{f.path}: cannot read Parquet data ({one_line(exc)})") from None
    if table.num_rows != f.rows:  # the footer said so (open_checked); its data says otherwise
        raise TraceError(f"{f.path}: its data holds {table.num_rows} rows, its footer and "
                         f"commit marker say {f.rows}")
    if nulls := [n for n, c in zip(table.column_names, table.columns) if c.null_count]:
        raise TraceError(f"{f.path}: column {nulls[0]} holds nulls, which a recorder never "
                         "writes: the file is damaged or another tool wrote it")
    _check_text(f, table)
    # From the buffers: to_numpy() imports pandas, a third of verify's time.
    _check_unique_ids(f, column_to_python(table.column("event_id"), "int64"))
    return _with_added_columns(f.kind, table)


def _check_unique_ids(f: SegmentFile, ids: np.ndarray) -> None:
    """No event id is in two rows: a repeated one (a row duplicated by an edit) would read as
    two events, which ``verify`` reports as the scheduler's divergence. Segments' id ranges are
    disjoint (``SegmentFile.check_event_ids``), so one file at a time finds every repeat."""
    if len(ids) < 2 or (np.diff(ids) > 0).all():  # the recorder writes them rising
        return
    ordered = np.sort(ids)
    repeats = np.flatnonzero(np.diff(ordered) == 0)
    if len(repeats):
        repeated = ordered[repeats[0]]
        raise TraceError(f"{f.path}: event id {repeated} is in {int((ids == repeated).sum())} "
                         "rows: the file is damaged or another tool wrote it")


def _check_text(f: SegmentFile, table: pa.Table) -> None:
    """Every string column is UTF-8: Parquet's reader hands over a data page's bytes as they
    are, so a flipped bit there would surface later as a ``UnicodeDecodeError`` out of whichever
    reader turns the value into text (``inspect``, ``verify``, the exports)."""
    for name, column in zip(table.column_names, table.columns):
        if not pa.types.is_string(column.type):
            continue
        try:
            column.validate(full=True)
        except pa.ArrowInvalid:
            raise TraceError(f"{f.path}: column {name} holds text that is not UTF-8: the file "
                             "is damaged or another tool wrote it") from None


def _with_added_columns(kind: str, table: pa.Table) -> pa.Table:
    """An older-version table with the columns added since, at their implied values."""
    missing = [n for n in ADDED_COLUMN_DEFAULTS.get(kind, {}) if n not in table.column_names]
    if not missing:
        return table
    schema = arrow_schema(kind)
    defaults = ADDED_COLUMN_DEFAULTS[kind]
    for name in missing:
        field = schema.field(name)
        if pa.types.is_string(field.type):
            column = _constant_strings(defaults[name], table.num_rows)
            table = table.append_column(field, column)
            continue
        # From raw buffers: pa.array and pa.scalar import pandas (a third of verify's time).
        values = np.full(table.num_rows, defaults[name], dtype=field.type.to_pandas_dtype())
        if pa.types.is_boolean(field.type):
            data = pa.py_buffer(np.packbits(values, bitorder="little").tobytes())
        else:
            data = pa.py_buffer(values.tobytes())
        column = pa.Array.from_buffers(field.type, table.num_rows, [None, data])
        table = table.append_column(field, column)
    return table.select(schema.names)


def _constant_strings(value: str, rows: int) -> pa.Array:
    """A string column holding ``value`` in every row, from raw buffers (no pandas)."""
    data = value.encode("utf-8")
    offsets = np.arange(rows + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(pa.string(), rows,
                                 [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data * rows)])


def read_trace(path: str | Path, validate: bool = True) -> Trace:
    """Open the trace directory ``path``.

    With ``validate`` (the default) every committed file's footer is checked now (Parquet magic,
    schema, row count), so a damaged file is reported before any analysis starts.
    Raises ``TraceError`` (one line, naming the file) for anything that is not a readable trace.
    An incomplete trace (no ``summary.json``) whose committed segments from some segment on lack
    a file, or hold one cut short (a copy taken while it was being recorded), reads as the
    segments before it; ``Trace.unread_note`` says so.
    """
    root = Path(path)
    if not is_present(root):
        raise TraceError(f"{root}: no such trace directory")
    if not root.is_dir():
        raise TraceError(f"{root}: not a trace (a trace is a directory holding {HEADER_FILE})")
    header_path = root / HEADER_FILE
    if not is_present(header_path) or not header_path.is_file():
        raise TraceError(f"{root}: not a trace directory (no {HEADER_FILE})")
    header = load_json(header_path, "trace header")
    check_header(header_path, header)
    summary_path = root / SUMMARY_FILE
    summary = load_json(summary_path, "trace summary") if is_present(summary_path) else None
    segments, unread = committed_segments(root, tail_ok=summary is None)
    if summary is not None:
        check_summary(summary_path, summary, len(segments), header["schema_version"])
        committed = Commits(segments, summary)  # complete: every row the markers list
        check_summary_figures(summary_path, summary, committed.last_step, committed.counts())
    if validate:
        segments, unread = validate_files(root, segments, unread, header["schema_version"],
                                          summary is None)
    return Trace(root, header, summary, segments, unread)


