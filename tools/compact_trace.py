"""Rewrite a complete trace as one segment (fewer, larger files: smaller on disk).

    python tools/compact_trace.py SRC DST

A trace recorded over many flushes holds one file per event kind per segment; committed traces
are compacted so they stay small. The events, header and summary figures are those of SRC.
Only a trace of the current schema version is compacted: the recorder writes its own version,
so an older SRC would come out relabelled, its filled-in columns presented as recorded. Any
error (SRC missing, incomplete, damaged or older; DST in use) is one line on stderr, exit 2,
and leaves SRC and DST as they were.
"""

from __future__ import annotations

import sys

from tracing.errors import TraceError, one_line
from tracing.events import EventBuffer
from tracing.reader import read_trace
from tracing.recorder import ParquetRecorder
from tracing.schema import EVENT_KINDS, SCHEMA_VERSION, all_columns

USAGE = "usage: python tools/compact_trace.py SRC DST"
EXIT_ERROR = 2


def compact(src: str, dst: str) -> None:
    """Write SRC's events as a one-segment trace at DST (``TraceError``, one line, if not)."""
    trace = read_trace(src)
    if not trace.complete:
        raise TraceError(f"{src}: incomplete trace; only a complete one is compacted")
    version = trace.header["schema_version"]
    if version != SCHEMA_VERSION:
        raise TraceError(f"{src}: schema version {version}, but compact_trace writes version "
                         f"{SCHEMA_VERSION} and would relabel it; compact it with the replayllm "
                         "release that recorded it")
    buffer = EventBuffer()
    for kind in EVENT_KINDS:
        cols = trace.columns(kind)
        buffer.tables[kind] = {name: [v.tolist() if hasattr(v, "tolist") else v
                                      for v in cols[name]] if name == "prompt_token_ids"
                               else list(cols[name].tolist() if hasattr(cols[name], "tolist")
                                         else cols[name]) for name in all_columns(kind)}
    buffer.step = int(trace.last_step) + 1
    header = {k: v for k, v in trace.header.items() if k != "schema_version"}
    recorder = ParquetRecorder(dst, flush_steps=1 << 30, flush_seconds=1e9, command="compact")
    recorder.open(header)
    summary = {k: v for k, v in (trace.summary or {}).items()
               if k not in ("segments", "counts", "num_events", "trace_bytes", "recorder",
                            "complete", "last_step", "schema_version", "end_time")}
    recorder.close(buffer, summary)


def main(argv: list[str]) -> int:
    """``compact_trace SRC DST``: 0 when written, 2 (one line on stderr) for any error."""
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return EXIT_ERROR
    try:
        compact(argv[0], argv[1])
    except TraceError as exc:  # OutputDirError (DST in use) included
        print(f"compact_trace: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
