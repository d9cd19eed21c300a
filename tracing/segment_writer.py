"""The writer half of the Parquet recorder: segments to committed files, in order.

A ``SegmentWriter`` owns the background threads (one committing segments in order, a few writing
one segment's files at once), what is in flight, and the first error. Each segment becomes one
zstd Parquet file per event kind under a hidden temporary name, then its commit marker, then the
files are renamed into place: the marker is the commit point (docs/trace-format.md).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from tracing.errors import TraceError, one_line
from tracing.layout import fsync_dir, marker_file, segment_file, tmp_path, write_json_atomic
from tracing.outdir import create_exclusive, make_dir_nofollow, write_all
from tracing.schema import column_types

# Segments handed to the writer but not yet on disk; beyond this the engine waits (bounds memory).
MAX_PENDING_SEGMENTS = 4
# Threads writing one segment's files (one per kind) at once: each fsync waits on the disk and
# concurrent fsyncs share journal commits (11 files sync in ~1/4 of the serial time on ext4).
# Few, because each one also contends for the GIL for a little Python glue per file.
IO_THREADS = 4
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1  # level 3 saves ~1% of the bytes for ~25% more encoding time
INTEGER_ENCODING = "DELTA_BINARY_PACKED"
_INTEGER_TYPES = frozenset({"int32", "int64"})
_T = TypeVar("_T")


def _string_columns(kind: str) -> list[str]:
    return [name for name, t in column_types(kind).items() if t == "string"]


def _integer_encodings(kind: str) -> dict[str, str]:
    """Delta encoding for every integer column (a list's leaf included).

    Ids, steps and counters barely change from row to row: delta + zstd stores the reference
    trace in about a third of the bytes of plain + zstd, and writes it faster.
    """
    out = {}
    for name, t in column_types(kind).items():
        leaf = t[len("list<") : -1] if t.startswith("list<") else t
        if leaf in _INTEGER_TYPES:
            out[f"{name}.list.element" if leaf != t else name] = INTEGER_ENCODING
    return out


@dataclass(frozen=True)
class Segment:
    """One segment's events as Arrow tables, on its way to the writer."""

    index: int
    through_step: int
    tables: dict[str, pa.Table]
    first_event_id: int | None
    last_event_id: int | None


class SegmentWriter:
    """Writes segments of one trace directory, on background threads or (``background=False``)
    on the caller's. Errors surface as ``TraceError`` from ``submit``, ``drain`` or ``write``."""

    def __init__(self, root: Path, background: bool, fsync: bool) -> None:
        self.root = root
        self.fsync = fsync
        self.failed: TraceError | None = None
        self.bytes_written = 0
        self.write_s = 0.0  # Parquet encoding, writing, syncing and committing
        self.write_cpu_s = 0.0  # CPU time of the same (the rest of write_s is I/O and GIL waits)
        self._pool: ThreadPoolExecutor | None = None  # commits segments, one at a time, in order
        self._io_pool: ThreadPoolExecutor | None = None  # writes one segment's files in parallel
        if background:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-writer")
            self._io_pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="trace-io")
        self._pending: deque[Future[None]] = deque()
        self._made_dirs: set[str] = set()

    def submit(self, segment: Segment) -> None:
        """Write ``segment`` after the ones before it; wait while too many are in flight."""
        if self._pool is None:
            self.write(segment)
            return
        self._pending.append(self._pool.submit(self.write, segment))
        if len(self._pending) > MAX_PENDING_SEGMENTS:
            self.drain(wait_all=False, wait_one=True)

    def shutdown(self) -> None:
        """Stop the threads once their work is done."""
        for pool in (self._pool, self._io_pool):
            if pool is not None:
                pool.shutdown(wait=True)

    def drain(self, wait_all: bool, wait_one: bool = False) -> None:
        """Collect finished writes (re-raising their errors); wait for one or all if asked."""
        while self._pending and (wait_all or wait_one or self._pending[0].done()):
            self._pending.popleft().result()
            wait_one = False

    def write(self, segment: Segment) -> None:
        """Write and commit ``segment`` on this thread (the pool calls it for ``submit``)."""
        if self.failed is not None:
            # Never commit past a failed segment: the trace stays a gap-free prefix.
            raise self.failed
        try:
            self._write_segment_files(segment)
        except TraceError as exc:
            self.failed = exc
            raise
        except Exception as exc:  # the engine's thread expects TraceError only
            self.failed = TraceError(
                f"{self.root}: segment {segment.index} failed "
                f"({type(exc).__name__}: {one_line(exc)})"
            )
            raise self.failed from exc

    def _write_segment_files(self, segment: Segment) -> None:
        began = time.perf_counter()
        began_cpu = time.thread_time()
        root = self.root
        index = segment.index
        finals = {kind: root / segment_file(kind, index) for kind in segment.tables}
        jobs = [(kind, table, finals[kind]) for kind, table in segment.tables.items()]
        self.bytes_written += sum(self._map_io(self._write_file, jobs))
        files = {
            kind: {"file": segment_file(kind, index), "rows": table.num_rows}
            for kind, table in segment.tables.items()
        }
        marker = {
            "segment": index,
            "through_step": segment.through_step,
            "first_event_id": segment.first_event_id,
            "last_event_id": segment.last_event_id,
            "num_events": sum(f["rows"] for f in files.values()),
            "files": files,
        }
        try:
            if self.fsync:
                self._map_io(fsync_dir, [(root / kind,) for kind in files])
            # The commit point: from here on the reader sees the segment (under either name).
            write_json_atomic(root / marker_file(index), marker, self.fsync)
            for final in finals.values():
                os.replace(tmp_path(final), final)
        except OSError as exc:
            raise TraceError(f"{root / marker_file(index)}: cannot commit ({exc})") from None
        self.write_s += time.perf_counter() - began
        self.write_cpu_s += time.thread_time() - began_cpu

    def _map_io(self, fn: Callable[..., _T], jobs: list[tuple[Any, ...]]) -> list[_T]:
        """``fn(*job)`` for every job, on the I/O threads where there are any, in job order."""
        futures: list[Future[_T]] = []
        if self._io_pool is not None:
            try:
                for job in jobs:
                    futures.append(self._io_pool.submit(fn, *job))
            except RuntimeError:
                # The interpreter is exiting without close(): concurrent.futures takes no new
                # work then, so the segments already handed over are finished on this thread.
                pass
        done = [f.result() for f in futures]
        return done + [fn(*job) for job in jobs[len(futures) :]]

    def _write_file(self, kind: str, table: pa.Table, final: Path) -> int:
        """Write one kind's file of a segment under its temporary name; return its size."""
        tmp = tmp_path(final)
        try:
            if kind not in self._made_dirs:
                make_dir_nofollow(final.parent)
                self._made_dirs.add(kind)
            # Encode into memory, then one os.write: pyarrow encodes without the GIL, whereas a
            # Python file object would take the GIL for every page it writes, and a path costs
            # ~0.5 ms of GIL-held filesystem resolution per file.
            encoded = pa.BufferOutputStream()
            pq.write_table(
                table.combine_chunks(),  # one chunk per step staged: one row group, big pages
                encoded,
                compression=COMPRESSION,
                compression_level=COMPRESSION_LEVEL,
                use_dictionary=_string_columns(kind) or False,
                column_encoding=_integer_encodings(kind),
            )
            data = encoded.getvalue()
            fd = create_exclusive(tmp)
            try:
                write_all(fd, data)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            return data.size
        except (OSError, pa.ArrowException, ValueError) as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise TraceError(f"{final}: cannot write segment ({one_line(exc)})") from None
