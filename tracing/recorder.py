"""The Parquet recorder: an ``EventSink`` that writes a trace directory in committed segments.

At every step end the engine's buffer is drained into Arrow tables (cheap per step). Every
``flush_steps`` steps or ``flush_seconds`` seconds (whichever comes first) those tables make a
segment, and one background writer
thread writes one zstd Parquet file per event kind that has rows (each under a hidden temporary
name), then the segment's commit marker, then renames the files into place. The
marker is the commit point: the reader ignores anything a marker does not list, so a kill -9 at
any moment leaves a readable prefix of whole segments. See docs/trace-format.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracing.convert import columns_to_table
from tracing.errors import TraceError, one_line
from tracing.events import EventBuffer
from tracing.interrupt_guard import sigint_deferred
from tracing.layout import (
    COMMITS_DIR,
    DEFAULT_FLUSH_SECONDS,
    DEFAULT_FLUSH_STEPS,
    HEADER_FILE,
    SUMMARY_FILE,
    TRACE_WRITERS,
    segment_file,
    trace_entries,
    trace_is_complete,
    write_json_atomic,
)
from tracing.outdir import (
    TRACE,
    DirLock,
    check_output_dir,
    make_dir_nofollow,
    replace_dir,
    write_owner,
)
from tracing.schema import EVENT_KINDS, SCHEMA_VERSION, column_types
from tracing.segment_process import ProcessSegmentWriter
from tracing.segment_writer import Segment, SegmentWriter

# Events converted to Arrow together, on the engine's thread. A conversion costs ~1 ms on the
# device hosts whatever its size up to a few thousand rows, while a whole segment of a full
# batch at once stalled an overlapped engine for 4-15 ms: counted in events, not steps, the
# reference's 256-row decodes convert every ~8 steps (~520 events a step, under their ~5.5 ms of
# device time), while a few-row decode (~1 ms of device time, a few events) no longer pays a
# conversion every 8th step, which made its host the step's bound (docs/gpu-notes.md,
# session 36); its events wait for the segment's flush.
STAGE_EVENTS = 4096


def stage_due(pending_events: int, stage_events: int = STAGE_EVENTS) -> bool:
    """Whether the recorder converts the events buffered since its last conversion now, at the
    end of a step (``ParquetRecorder.on_step_end``; segment flushes convert whatever is left)."""
    return pending_events >= stage_events


class ParquetRecorder:
    """Records the engine's events to a trace directory (an ``EventSink``).

    ``trace_dir`` is created if needed. A trace already there is replaced only if a replayllm
    recorder wrote it, no process is recording it, and (when it is complete) ``overwrite``
    (``tracing.outdir``); the directory stays locked until ``close``. ``command`` names the
    writer in the directory's owner record.
    ``background=False`` writes segments on the calling thread (for measurement and debugging).
    ``fsync=True`` makes each commit durable against power loss, not only against a killed process.
    ``writer="process"`` writes segments in a child process (``tracing.segment_process``) instead
    of background threads of this one (``"thread"``), so their encoding never competes with the
    engine's thread for the interpreter.
    Errors of the writer thread surface as ``TraceError`` at the next ``on_step_end`` or ``close``.
    """

    def __init__(
        self,
        trace_dir: str | Path,
        flush_steps: int = DEFAULT_FLUSH_STEPS,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        *,
        background: bool = True,
        fsync: bool = True,
        overwrite: bool = False,
        command: str = "api",
        writer: str = "thread",
    ) -> None:
        if isinstance(flush_steps, bool) or not isinstance(flush_steps, int) or flush_steps < 1:
            raise ValueError(f"flush_steps must be an integer >= 1, got {flush_steps!r}")
        if not isinstance(flush_seconds, (int, float)) or not flush_seconds >= 0:
            raise ValueError(f"flush_seconds must be a number >= 0, got {flush_seconds!r}")
        if writer not in TRACE_WRITERS:
            raise ValueError(f"writer must be one of {', '.join(TRACE_WRITERS)}, got {writer!r}")
        self.trace_dir = Path(trace_dir)
        self.writer = writer
        self.flush_steps = flush_steps
        self.flush_seconds = float(flush_seconds)
        self.background = background
        self.fsync = fsync
        self.overwrite = overwrite
        self.command = command
        self._lock: DirLock | None = None
        self.header: dict[str, Any] = {}
        self.counts: dict[str, int] = dict.fromkeys(EVENT_KINDS, 0)
        self.num_segments = 0
        self.last_step = -1
        self.convert_s = 0.0  # lists -> Arrow, on the engine's thread (inside on_step_end/close)
        self.step_end_s = 0.0  # time the engine's thread spent inside on_step_end
        self.close_s = 0.0  # time close() took: the last flush plus waiting for the writer
        self._opened = False
        self._closed = False
        self._steps_since_flush = 0
        self._last_flush = time.monotonic()
        self._writer: SegmentWriter | ProcessSegmentWriter | None = None
        self._failed: TraceError | None = None  # a conversion failed on the engine's thread
        # Arrow tables of the events since the last segment, and their event id range.
        self._staged: dict[str, list[pa.Table]] = {kind: [] for kind in EVENT_KINDS}
        self._first_id: int | None = None
        self._last_id: int | None = None
        # Buffered events converted to Arrow together (``STAGE_EVENTS``); a benchmark may raise
        # it to defer every conversion to the next flush.
        self.stage_events = STAGE_EVENTS

    @property
    def writer_pid(self) -> int | None:
        """The writer process's id (``writer="process"``, once open), else None."""
        writer = self._writer
        return writer.pid if isinstance(writer, ProcessSegmentWriter) else None

    # --- what the writer measured (zero before open) ---------------------------------------------
    @property
    def bytes_written(self) -> int:
        return self._writer.bytes_written if self._writer is not None else 0

    @property
    def write_s(self) -> float:
        """Parquet encoding, writing, syncing and committing, on the writer."""
        return self._writer.write_s if self._writer is not None else 0.0

    @property
    def write_cpu_s(self) -> float:
        return self._writer.write_cpu_s if self._writer is not None else 0.0

    # --- EventSink --------------------------------------------------------------------------------
    def open(self, header: dict[str, Any]) -> None:
        """Create the trace directory and write ``run.json`` (``schema_version`` is added here)."""
        if self._opened:
            raise TraceError(f"{self.trace_dir}: recorder is already open")
        self._prepare_dir()
        self.header = {"schema_version": SCHEMA_VERSION, **header}
        self.header["schema_version"] = SCHEMA_VERSION
        try:
            write_json_atomic(self.trace_dir / HEADER_FILE, self.header, self.fsync)
        except OSError as exc:
            self._release_failed_open()
            raise TraceError(f"{self.trace_dir / HEADER_FILE}: cannot write ({exc})") from None
        self._writer = (ProcessSegmentWriter(self.trace_dir, self.fsync)
                        if self.writer == "process" and self.background
                        else SegmentWriter(self.trace_dir, self.background, self.fsync))
        self._opened = True
        self._last_flush = time.monotonic()

    def on_step_end(self, buffer: EventBuffer) -> None:
        """Convert the buffered events to Arrow once ``stage_events`` of them wait (a batch a
        step's device time hides, ``stage_due``), and flush a segment when ``flush_steps``
        steps or ``flush_seconds`` have gone by."""
        began = time.perf_counter()
        self._steps_since_flush += 1
        stage = stage_due(buffer.num_events(), self.stage_events)
        flush = (self._steps_since_flush >= self.flush_steps
                 or time.monotonic() - self._last_flush >= self.flush_seconds)
        if stage or flush:
            with sigint_deferred():  # rows move whole or not at all (tracing/interrupt_guard.py)
                if stage:
                    self._stage(buffer.drain())
                if flush:
                    # The step counter has moved on: every event of steps < buffer.step is in.
                    self._flush(buffer, buffer.step - 1)
        self.step_end_s += time.perf_counter() - began

    def on_idle(self, buffer: EventBuffer) -> None:
        """The engine waits for a later arrival: flush a segment if ``flush_seconds`` have gone
        by since the last one, so a kill while idle loses at most that much of the events.

        Every step before ``buffer.step`` is over; events since (arrivals) carry ``buffer.step``
        and are written too, committed with the step they come before."""
        if not self._opened or self._closed:
            return
        if time.monotonic() - self._last_flush < self.flush_seconds:
            return
        began = time.perf_counter()
        with sigint_deferred():
            self._flush(buffer, buffer.step - 1)
        self.step_end_s += time.perf_counter() - began

    def close(self, buffer: EventBuffer, summary: dict[str, Any]) -> None:
        """Flush what is left, wait for the writer, then write ``summary.json``.

        Claiming the close and handing the last segment over run with Ctrl-C deferred: a
        ``KeyboardInterrupt`` before them changed nothing (``close`` may be called again), one
        after them still waits for the writer (no summary then: the trace is incomplete)."""
        if not self._opened:
            raise TraceError(f"{self.trace_dir}: close() before open()")
        if self._closed:
            return
        try:
            self._close(buffer, summary)
        finally:
            if self._closed and self._lock is not None:
                self._lock.release()

    def _close(self, buffer: EventBuffer, summary: dict[str, Any]) -> None:
        began = time.perf_counter()
        assert self._writer is not None  # opened
        try:
            with sigint_deferred():
                self._closed = True
                # Events after the last step (late requests, aborts) carry step == buffer.step.
                tail_steps = [cols["step"][-1] for cols in buffer.tables.values() if cols["step"]]
                through = max([buffer.step - 1, *tail_steps])
                # A zero-row file for each kind that never had rows keeps
                # `pd.read_parquet("T/kind")` (and duckdb's glob) working on every kind.
                never_seen = [k for k in EVENT_KINDS
                              if self.counts[k] == 0 and not buffer.counts()[k]]
                self._flush(buffer, through, schema_only=never_seen)
            self._writer.drain(wait_all=True)
        finally:
            if self._closed:  # (else Ctrl-C came before anything changed)
                self._writer.shutdown()
        self.close_s = time.perf_counter() - began
        if summary.get("interrupted"):  # a stopped run: every step committed, no summary
            return
        out = dict(summary)
        out.update(
            {
                "schema_version": SCHEMA_VERSION,
                "complete": True,
                "segments": self.num_segments,
                "last_step": self.last_step,
                "num_events": sum(self.counts.values()),
                "counts": dict(self.counts),
                "trace_bytes": self.bytes_written,
                "recorder": {
                    "flush_steps": self.flush_steps,
                    "flush_seconds": self.flush_seconds,
                    "background": self.background,
                    "writer": self.writer,
                    "fsync": self.fsync,
                    "step_end_s": round(self.step_end_s, 6),
                    "close_s": round(self.close_s, 6),
                    "convert_s": round(self.convert_s, 6),
                    "write_s": round(self.write_s, 6),
                    "write_cpu_s": round(self.write_cpu_s, 6),
                },
                "end_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
        try:
            write_json_atomic(self.trace_dir / SUMMARY_FILE, out, self.fsync)
        except OSError as exc:
            raise TraceError(f"{self.trace_dir / SUMMARY_FILE}: cannot write ({exc})") from None

    # --- internals --------------------------------------------------------------------------------
    def _prepare_dir(self) -> None:
        """Claim the trace directory: replace an old trace only as ``tracing.outdir`` allows
        (ours, not locked, complete only with ``overwrite``), then lock it until ``close``."""
        root = self.trace_dir
        if check_trace_dir(root, self.overwrite):
            replace_dir(root)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TraceError(f"{root}: cannot create trace directory ({exc})") from None
        self._lock = DirLock(root)
        try:
            write_owner(root, TRACE, self.command)
            make_dir_nofollow(root / COMMITS_DIR)
        except OSError as exc:
            self._release_failed_open()
            raise TraceError(f"{root}: cannot create trace directory ({exc})") from None

    def _release_failed_open(self) -> None:
        """An open that failed (a full disk) lets the directory go: a later recorder of this
        process may claim it, rather than find it held by its own pid."""
        if self._lock is not None:
            self._lock.abandon()
            self._lock = None

    def _flush(
        self, buffer: EventBuffer, through_step: int, schema_only: list[str] | None = None
    ) -> None:
        self._steps_since_flush = 0
        self._last_flush = time.monotonic()
        writer = self._writer
        assert writer is not None  # opened
        writer.drain(wait_all=False)
        if self._failed is not None or writer.failed is not None:
            raise self._failed or writer.failed  # type: ignore[misc]
        self._stage(buffer.drain())
        if not any(self._staged.values()) and not schema_only:
            return
        index = self.num_segments
        segment = self._segment(index, through_step, schema_only or [])
        self.num_segments += 1
        self.last_step = max(self.last_step, through_step)
        writer.submit(segment)

    def _stage(self, tables: dict[str, dict[str, list]]) -> None:
        """Turn drained column lists into Arrow tables, on the engine's thread, and keep them
        for the next segment.

        Converting Python lists needs the GIL throughout. Done by the writer thread, it would
        hold the GIL just when the engine returns from waiting on the device, and each such
        collision costs the engine up to the interpreter's 5 ms switch interval. Done here, a few
        events at a time (``STAGE_EVENTS``), an overlapped step hides it under device time
        (converting a whole segment at once stalled the device for 4-15 ms every 64 steps), and
        the writer is left with work that releases the GIL (Parquet encoding, compression, file
        I/O).
        """
        began = time.perf_counter()
        for kind in EVENT_KINDS:
            cols = tables[kind]
            rows = len(cols["event_id"])
            if rows == 0:
                continue
            self.counts[kind] += rows
            first, last = cols["event_id"][0], cols["event_id"][-1]
            self._first_id = first if self._first_id is None else min(self._first_id, first)
            self._last_id = last if self._last_id is None else max(self._last_id, last)
            try:
                self._staged[kind].append(columns_to_table(kind, cols))
            except (pa.ArrowException, OverflowError, TypeError, ValueError, AttributeError) as exc:
                self._failed = TraceError(
                    f"{self.trace_dir / segment_file(kind, self.num_segments)}: cannot convert "
                    f"events ({type(exc).__name__}: {one_line(exc)})"
                )
                raise self._failed from None
        self.convert_s += time.perf_counter() - began

    def _segment(self, index: int, through_step: int, schema_only: list[str]) -> Segment:
        """The staged tables as one segment (concatenated without copying), staging reset."""
        arrow: dict[str, pa.Table] = {}
        for kind in EVENT_KINDS:
            parts = self._staged[kind]
            if parts:
                arrow[kind] = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
            elif kind in schema_only:
                arrow[kind] = columns_to_table(kind, {c: [] for c in column_types(kind)})
        segment = Segment(index, through_step, arrow, self._first_id, self._last_id)
        self._staged = {kind: [] for kind in EVENT_KINDS}
        self._first_id = self._last_id = None
        return segment

def check_trace_dir(path: str | Path, overwrite: bool) -> bool:
    """Raise ``TraceError`` unless a new trace may be recorded at ``path`` (nothing changes on
    disk); True when an old trace is there to be replaced. Commands call it before loading a
    model, so a bad ``--out`` fails at once; the recorder calls it again when it opens."""
    return check_output_dir(Path(path), TRACE, overwrite, trace_entries(), trace_is_complete)


