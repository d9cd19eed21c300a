"""Rewrite a complete trace as one segment (fewer, larger files: smaller on disk).

    python tools/compact_trace.py SRC DST

A trace recorded over many flushes holds one file per event kind per segment; committed traces
are compacted so they stay small. The events, header and summary figures are those of SRC.
"""

from __future__ import annotations

import sys

from tracing.events import EventBuffer
from tracing.reader import read_trace
from tracing.recorder import ParquetRecorder
from tracing.schema import EVENT_KINDS, all_columns


def compact(src: str, dst: str) -> None:
    trace = read_trace(src)
    if not trace.complete:
        raise SystemExit(f"{src}: incomplete trace; only a complete one is compacted")
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


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python tools/compact_trace.py SRC DST")
    compact(sys.argv[1], sys.argv[2])
