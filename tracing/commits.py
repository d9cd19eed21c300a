"""The commit bookkeeping of a trace directory: which segments and files are committed, and
which of their rows belong to the committed prefix.

A segment is committed once its marker in ``_commits/`` exists. ``Commits`` holds the committed
segments and owns the one rule every reader of an incomplete trace applies: its rows are those
of steps 0 to ``last_step`` (the prefix ``verify`` checks). A killed run's last segment can hold
the first events of the step after (its arrivals and, under async scheduling, its schedule:
admissions, prefix-cache hits), committed with it though that step never ran whole.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracing.errors import TraceError, UnfinishedFile, one_line
from tracing.layout import COMMITS_DIR, marker_file, marker_index, tmp_path
from tracing.schema import EVENT_KINDS
from tracing.validate import check_marker

PARQUET_ERRORS = (OSError, pa.ArrowException, ValueError)


def is_present(path: Path) -> bool:
    """Whether ``path`` exists (links followed): False where it, or a directory on its way, is
    not there. Whatever keeps the answer from being known (no permission to search a directory,
    a name too long, a link looping on itself) is a ``TraceError`` naming the path, as is a
    symbolic link to nothing: ``Path.exists()`` raises for the first and answers False for the
    others, so a trace read as if the file were simply absent (an incomplete one)."""
    try:
        os.stat(path)
        return True
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            raise TraceError(f"{path}: a symbolic link to nothing "
                             f"({os.readlink(path)})") from None
        return False
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or one_line(exc)})") from None


@dataclass(frozen=True)
class SegmentFile:
    """One committed Parquet file: its kind, its segment, its (final) path and its rows."""

    kind: str
    segment: int
    path: Path
    rows: int
    # The event-id range its segment's marker gives (None: a marker without one).
    first_event_id: int | None = None
    last_event_id: int | None = None

    def located(self) -> Path:
        """Where the file is now: its final name, or the temporary one if the writer died (or,
        for a trace being recorded, has not yet renamed it) after committing the segment."""
        return self.path if is_present(self.path) else tmp_path(self.path)

    def size(self) -> int:
        """Its size in bytes, under whichever name it has; the writer of a trace being recorded
        may rename it from the temporary name to the final one at any moment."""
        for path in (self.path, tmp_path(self.path), self.path):  # final, temporary, renamed
            try:
                return path.stat().st_size
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise TraceError(f"{path}: cannot read its size ({one_line(exc)})") from None
        raise TraceError(f"{self.path}: missing, but its segment is committed")

    def open(self) -> pq.ParquetFile:
        """The file, opened for reading (``TraceError``, one line, if missing or damaged)."""
        path = self.located()
        if not is_present(path):
            path = self.path  # the writer renamed it since located() looked
        try:
            return pq.ParquetFile(_arrow_source(path))
        except FileNotFoundError:
            raise UnfinishedFile(f"{self.path}: missing, but its segment is committed") from None
        except pa.ArrowInvalid as exc:  # no footer: cut short (or not Parquet at all)
            raise UnfinishedFile(
                f"{path}: not a readable Parquet file, truncated or corrupted ({one_line(exc)})"
            ) from None
        except PARQUET_ERRORS as exc:
            raise TraceError(
                f"{path}: not a readable Parquet file, truncated or corrupted ({one_line(exc)})"
            ) from None

    def check_event_ids(self, pf: pq.ParquetFile) -> None:
        """``TraceError`` unless its ``event_id`` values lie in its segment's range (the
        footer's statistics, else the column itself): a file copied from another segment
        (same kind and row count) would otherwise read as events of this one."""
        first, last = self.first_event_id, self.last_event_id
        if first is None or last is None or pf.metadata.num_rows == 0:
            return
        bounds = column_bounds(pf, "event_id", self.path)
        if bounds is None:
            ids = self.read_column(pf, "event_id")
            bounds = (int(ids.min()), int(ids.max()))
        low, high = bounds
        if low < first or high > last:
            raise TraceError(f"{self.path}: holds event ids {low}..{high}, outside segment "
                             f"{self.segment}'s {first}..{last}: a file of another segment "
                             "or trace was copied here")

    def rows_after(self, step: int) -> int:
        """How many of its rows belong to steps after ``step`` (from the footer's statistics
        when they rule it out, else by reading the ``step`` column alone)."""
        pf = self.open()
        if pf.metadata.num_row_groups == 0:
            return 0
        bounds = column_bounds(pf, "step", self.path)
        if bounds is not None and bounds[1] <= step:
            return 0
        return int((self.read_column(pf, "step") > step).sum())

    def read_column(self, pf: pq.ParquetFile, name: str) -> np.ndarray:
        """Column ``name`` of the file alone, as numpy (a ``TraceError`` where it cannot be
        read)."""
        try:
            return np.asarray(pf.read(columns=[name]).column(name))
        except (*PARQUET_ERRORS, KeyError) as exc:
            raise TraceError(f"{self.path}: cannot read Parquet data ({one_line(exc)})") from None


def _arrow_source(path: Path) -> str | pa.NativeFile:
    """``path`` as pyarrow opens it: its text, or where that is not UTF-8 (a directory name of
    undecodable bytes, legal on Linux, which pyarrow cannot take as text) the file opened by
    its bytes."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return pa.OSFile(os.fsencode(path))
    return text


def column_bounds(pf: pq.ParquetFile, name: str, path: Path) -> tuple[int, int] | None:
    """The smallest and largest value of integer column ``name`` from the footer's statistics,
    or None where a row group has none. ``TraceError`` naming ``path`` (the file) for a footer
    whose column metadata is damaged: a name that is not UTF-8, or a column chunk whose type
    is not its schema column's (pyarrow ends the process, C++ ``terminate``, when such a
    chunk's statistics are looked at, so the type is compared first)."""
    meta = pf.metadata
    lows, highs = [], []
    try:
        for group in range(meta.num_row_groups):
            row_group = meta.row_group(group)
            column = None
            for i in range(row_group.num_columns):
                chunk = row_group.column(i)
                if chunk.path_in_schema != name:
                    continue
                schema_type = meta.schema.column(i).physical_type
                if chunk.physical_type != schema_type:
                    raise TraceError(f"{path}: damaged footer: column {name} of type "
                                     f"{chunk.physical_type}, the schema's {schema_type}")
                column = chunk
                break
            stats = column.statistics if column is not None else None
            if stats is None or not stats.has_min_max:
                return None
            lows.append(stats.min)
            highs.append(stats.max)
    except UnicodeDecodeError:
        raise TraceError(f"{path}: damaged footer: a column name that is not UTF-8") from None
    except (pa.ArrowException, IndexError, TypeError, ValueError) as exc:
        raise TraceError(f"{path}: damaged footer ({one_line(exc)})") from None
    return (int(min(lows)), int(max(highs))) if lows else None


@dataclass(frozen=True)
class Segment:
    """A committed segment: every event of steps <= ``through_step`` not in an earlier one."""

    index: int
    through_step: int
    num_events: int
    files: tuple[SegmentFile, ...]
    first_event_id: int | None = None
    last_event_id: int | None = None


class Commits:
    """The committed segments of a trace, whether it is complete, and its committed prefix.

    ``complete``: ``summary.json`` present and every segment it counts committed. ``last_step``:
    the last step whose events are all in the committed segments (-1 if none). For an incomplete
    trace only rows of steps up to ``last_step`` are committed rows (``prefix_table``,
    ``prefix_columns``, ``counts``); a complete trace's rows all are.
    """

    def __init__(self, segments: list[Segment], summary: dict[str, Any] | None) -> None:
        self.segments = segments
        self.last_step = max((s.through_step for s in segments), default=-1)
        expected = summary.get("segments") if summary is not None else None
        self.complete = summary is not None and expected in (None, len(segments))
        self._counts: dict[str, int] | None = None

    def files(self, kind: str | None = None) -> list[SegmentFile]:
        """The committed files (of ``kind``), in segment order."""
        return [f for seg in self.segments for f in seg.files if kind in (None, f.kind)]

    def counts(self) -> dict[str, int]:
        """Committed rows per event kind: the markers' counts, less (incomplete trace) the rows
        of steps after ``last_step``."""
        if self._counts is None:
            out = dict.fromkeys(EVENT_KINDS, 0)
            for f in self.files():
                out[f.kind] += f.rows
                if not self.complete and f.rows:
                    out[f.kind] -= f.rows_after(self.last_step)
            self._counts = out
        return dict(self._counts)

    def size_bytes(self) -> int:
        return sum(f.size() for f in self.files())

    def _keep(self, steps: Any) -> np.ndarray | None:
        """Which rows of an incomplete trace's table, by their ``step``, are committed; None
        when all are (a complete trace, or no row after ``last_step``)."""
        if self.complete or len(steps) == 0:
            return None
        keep = np.asarray(steps) <= self.last_step
        return None if keep.all() else keep

    def prefix_table(self, table: pa.Table) -> pa.Table:
        """``table``'s committed rows."""
        keep = self._keep(table.column("step"))
        return table if keep is None else table.filter(pa.array(keep))

    def prefix_columns(self, cols: dict[str, Any]) -> dict[str, Any]:
        """The committed rows of one table's columns (name -> numpy array or list)."""
        keep = self._keep(cols["step"])
        if keep is None:
            return cols
        rows = np.flatnonzero(keep)
        return {name: [values[i] for i in rows] if isinstance(values, list) else values[keep]
                for name, values in cols.items()}


def load_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path`` (``TraceError``, one line naming the file, otherwise)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read {what} ({exc.strerror or one_line(exc)})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: {what} is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{path}: {what} is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


def _parse_marker(root: Path, path: Path, index: int, data: dict[str, Any]) -> Segment:
    check_marker(path, index, data)
    files: list[SegmentFile] = []
    for kind, entry in data["files"].items():
        final = root / entry["file"]
        file = SegmentFile(kind, index, final, entry["rows"], data.get("first_event_id"),
                           data.get("last_event_id"))
        # The marker is written before the renames: a crash in between leaves the hidden name.
        if not is_present(file.located()):
            raise UnfinishedFile(f"{final}: missing, but committed by {path.name}")
        if file.located().is_symlink():
            raise TraceError(f"{final}: is a symbolic link, not a file the recorder wrote")
        files.append(file)
    num_events = sum(f.rows for f in files)
    return Segment(index, data["through_step"], num_events, tuple(files),
                   data.get("first_event_id"), data.get("last_event_id"))


@dataclass(frozen=True)
class UnreadTail:
    """The committed segments an incomplete trace's reader left unread, ``first`` to ``last``:
    from the first one with a file missing or cut short (``UnfinishedFile``, ``reason``) on.

    A copy of a trace taken while it was being recorded catches each directory at another
    moment: a commit marker can be copied after its files' directory was, so the copy lacks
    them (or holds one half-written). Every segment before it is whole (segments are committed
    in order), so the trace reads as that prefix, and says so (``describe``)."""

    first: int
    last: int
    reason: str

    def describe(self, last_step: int) -> str:
        """One line: what was not read, why, and what was."""
        which = (f"segment {self.first} is committed but not all its" if self.first == self.last
                 else f"segments {self.first} to {self.last} are committed but not all their")
        read = (f"read segments 0 to {self.first - 1}, through step {last_step}" if self.first
                else "read no segment")
        return (f"{which} files are there whole ({self.reason}; "
                f"a copy taken while the trace was being recorded, or a deleted file): {read}")


def committed_segments(root: Path, tail_ok: bool = False) -> tuple[list[Segment],
                                                                   UnreadTail | None]:
    """The segments of the trace directory ``root`` with a commit marker, in order
    (``TraceError`` for a gap, a damaged marker or a segment out of order). With ``tail_ok``
    (an incomplete trace) a segment whose file is missing ends the list there, the rest
    unread (``UnreadTail``); otherwise that is a ``TraceError`` too."""
    commits = root / COMMITS_DIR
    if not is_present(commits):
        return [], None
    if not commits.is_dir():  # never read as "no segment committed", an incomplete trace
        raise TraceError(f"{commits}: not a directory (it holds a trace's commit markers)")
    try:
        names = [p.name for p in commits.iterdir()]
    except OSError as exc:
        raise TraceError(f"{commits}: cannot list ({exc.strerror or one_line(exc)})") from None
    indices = sorted(i for name in names if (i := marker_index(name)) is not None)
    segments: list[Segment] = []
    for expected, index in enumerate(indices):
        path = root / marker_file(index)
        if index != expected:
            raise TraceError(
                f"{path}: segment {index} is committed but segment {expected} is not; "
                "a commit marker was deleted"
            )
        try:
            segment = _parse_marker(root, path, index, load_json(path, "commit marker"))
        except UnfinishedFile as exc:
            if not tail_ok:
                raise
            return segments, UnreadTail(index, indices[-1], relative_reason(root, exc))
        if segments:
            _check_follows(path, segments[-1], segment)
        segments.append(segment)
    return segments, None


def relative_reason(root: Path, exc: TraceError) -> str:
    """``exc``'s line with the trace directory's own path left out of the file it names."""
    return str(exc).replace(f"{root}{os.sep}", "", 1)


def _check_follows(path: Path, previous: Segment, segment: Segment) -> None:
    """A segment's steps and event ids come after its predecessor's (a duplicated or reordered
    segment is caught here)."""
    if segment.through_step < previous.through_step:
        raise TraceError(f"{path}: through_step {segment.through_step} is before segment "
                         f"{previous.index}'s {previous.through_step}")
    last = previous.last_event_id
    if last is not None and segment.first_event_id is not None and segment.first_event_id <= last:
        raise TraceError(f"{path}: event ids start at {segment.first_event_id}, but segment "
                         f"{previous.index} ends at {last} (a duplicated segment?)")
