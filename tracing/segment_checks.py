"""The checks ``read_trace`` makes of a trace's committed files before any table is read: each
file's footer (magic, columns, row count, event-id range) and, across segments, that their
steps follow one another with none missing and none claimed but never recorded.

Everything here reads footers only (their statistics), never a file's data, so opening a trace
stays cheap however long the run.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracing.commits import Segment, SegmentFile, UnreadTail, column_bounds, relative_reason
from tracing.errors import TraceError, UnfinishedFile
from tracing.layout import marker_file
from tracing.schema import ADDED_COLUMN_DEFAULTS, ADDED_IN_VERSION, arrow_schema

# A file's (smallest, largest) step; a file with no rows has none (NO_ROWS), a footer without
# statistics None.
StepBounds = tuple[int, int]
NO_ROWS: StepBounds = (0, -1)


def check_schema(f: SegmentFile, schema: pa.Schema, num_rows: int, version: int | None) -> None:
    """The file's columns are its kind's: a file of an older version may lack the columns
    added since (filled on reading; some version-5 traces predate columns of version 5), but
    never holds a column added after the header's schema ``version`` (a header edited to an
    older version would make verify skip comparing such a column: ``COMPARED_SINCE``)."""
    got = {field.name: field.type for field in schema}
    added = ADDED_COLUMN_DEFAULTS.get(f.kind, {})
    since = ADDED_IN_VERSION.get(f.kind, {})
    want = {
        field.name: field.type
        for field in arrow_schema(f.kind)
        if (field.name in got or field.name not in added)
        and (not isinstance(version, int) or since.get(field.name, 0) <= version)
    }
    if list(got.items()) != list(want.items()):
        problems = []
        if missing := [n for n in want if n not in got]:
            problems.append("missing columns " + ", ".join(missing))
        if extra := [n for n in got if n not in want]:
            problems.append("unexpected columns " + ", ".join(extra))
        problems += [
            f"{n} is {t}, expected {want[n]}" for n, t in got.items() if n in want and t != want[n]
        ]
        detail = "; ".join(problems) or "columns out of order"
        of = f" of version {version} (run.json)" if isinstance(version, int) else ""
        raise TraceError(f"{f.path}: columns do not match the {f.kind} schema{of}: {detail}")
    if num_rows != f.rows:
        raise TraceError(f"{f.path}: holds {num_rows} rows, its commit marker says {f.rows}")


def open_checked(f: SegmentFile, version: int | None) -> pq.ParquetFile:
    """The file opened, its footer validated (magic bytes, schema, row count, event-id range)
    without reading its data."""
    pf = f.open()
    meta = pf.metadata
    grouped = sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    if grouped != meta.num_rows:  # a bit flipped in the footer: the data holds other rows
        raise TraceError(f"{f.path}: damaged footer: it says {meta.num_rows} rows, its row "
                         f"groups hold {grouped}")
    check_schema(f, pf.schema_arrow, meta.num_rows, version)
    f.check_event_ids(pf)
    return pf


def _check_file(f: SegmentFile, version: int | None) -> StepBounds | None:
    """Validate a file's footer (``open_checked``); return its steps' bounds (``NO_ROWS``: no
    rows; None: the footer has no statistics)."""
    pf = open_checked(f, version)
    if not pf.metadata.num_rows:
        return NO_ROWS
    return column_bounds(pf, "step", f.path)


def _check_through_step(root: Path, segments: list[Segment],
                        steps: list[StepBounds | None]) -> None:
    """The last marker's ``through_step`` is a step some committed row belongs to (or one
    before it): a recorder commits only steps it took, so a marker claiming later steps was
    edited (an incomplete trace's reader would otherwise keep a cut step's rows)."""
    if not segments or any(bounds is None for bounds in steps):
        return
    last = segments[-1]
    top = max((bounds[1] for bounds in steps if bounds is not None), default=-1)
    if last.through_step > top:
        raise TraceError(f"{root / marker_file(last.index)}: through_step {last.through_step}, "
                         f"but no committed event is of a step after {top}: the marker was "
                         "edited")


def _check_steps_follow(root: Path, segment: Segment, after: int,
                        model_steps: StepBounds | None) -> None:
    """Segment ``segment`` holds the steps after ``after`` (the previous segment's
    ``through_step``, -1 for the first): where it holds ``model_step`` rows (one per step, at
    the step's end) they start at step ``after + 1``. Steps missing there (a segment deleted
    and the next renumbered into its place, or one taken from another trace) would read as a
    whole trace, and ``verify`` would call the hole a divergence. A segment without model
    steps (events after the last step, flushed by a close; a writer's test) proves nothing."""
    if model_steps is None or model_steps == NO_ROWS:
        return
    first = model_steps[0]
    if first > after + 1:
        raise TraceError(
            f"{root / marker_file(segment.index)}: follows a segment through step {after}, "
            f"but its model_step rows start at step {first}: steps {after + 1} to {first - 1} "
            "are missing (a segment deleted, or one from another trace)")


def validate_files(
    root: Path, segments: list[Segment], unread: UnreadTail | None, version: int,
    tail_ok: bool,
) -> tuple[list[Segment], UnreadTail | None]:
    """Check every committed file's footer (``_check_file``) and that the segments' steps follow
    one another; return the segments and the unread tail. With ``tail_ok`` (an incomplete
    trace) the first segment holding a file cut short ends the segments read, as a missing one
    does."""
    steps: list[StepBounds | None] = []
    after = -1
    for position, segment in enumerate(segments):
        try:
            found = [_check_file(f, version) for f in segment.files]
        except UnfinishedFile as exc:
            if not tail_ok:
                raise
            last = unread.last if unread is not None else segments[-1].index
            segments = segments[:position]
            unread = UnreadTail(segment.index, last, relative_reason(root, exc))
            break
        model_steps = next((bounds for f, bounds in zip(segment.files, found)
                            if f.kind == "model_step"), NO_ROWS)
        _check_steps_follow(root, segment, after, model_steps)
        after = segment.through_step
        steps += found
    _check_through_step(root, segments, steps)
    return segments, unread
