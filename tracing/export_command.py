"""``replayllm export``: a trace's timeline (Perfetto JSON) or KV events (vLLM's msgpack), to a
file or standard output. The command's choices live here, above the two exporters it picks from
(``tracing.export``, ``tracing.kv_events``)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from tracing.errors import TraceError
from tracing.export import export_perfetto, perfetto_json
from tracing.layout import EXPORT_FILE, KV_EXPORT_FILE

if TYPE_CHECKING:
    from tracing.reader import Trace

STDOUT = "-"  # ``replayllm export --out -``: the JSON on standard output


def run_export(trace_dir: str, out: str | None, fmt: str = "perfetto",
               force: bool = False) -> str | None:
    """``replayllm export TRACE [--format FMT] [--out OUT]``: write the export; return the line
    to print, or None when it went to standard output (``--out -``, the JSON format only).

    ``out`` None: the trace's own ``trace.json`` (``kv-events.msgpack``). An empty ``out`` is
    refused (it used to mean the default, silently), as is ``-`` for the binary KV format: one
    ``TraceError`` line each, before the trace is read."""
    from tracing.reader import read_trace

    if out == "":
        raise TraceError("--out is empty: give the export's file name (or - for standard "
                         "output, perfetto only)")
    if out == STDOUT and fmt != "perfetto":
        raise TraceError(f"--out - (standard output) takes the JSON format (perfetto); {fmt} "
                         "is binary msgpack: give a file name")
    if fmt == "vllm-kv-events":
        from tracing.kv_events import export_kv_events

        trace = read_trace(trace_dir)
        path, count = export_kv_events(trace, out or os.path.join(trace_dir, KV_EXPORT_FILE),
                                       force)
        return (f"wrote {path} ({count} KV events in vLLM's format, msgpack EventBatch maps)"
                f"{_unread(trace)}")
    trace = read_trace(trace_dir)
    if out == STDOUT:
        data = perfetto_json(trace)
        sys.stdout.flush()
        sys.stdout.buffer.write(data)  # a closed pipe: BrokenPipeError, the CLI's to handle
        sys.stdout.buffer.flush()
        if trace.unread_note:  # not into the JSON on standard output
            print(f"note: {trace.unread_note}", file=sys.stderr)
        return None
    target = out or os.path.join(trace_dir, EXPORT_FILE)
    export_perfetto(trace, target, force)
    return (f"wrote {target} (open it in https://ui.perfetto.dev or chrome://tracing)"
            f"{_unread(trace)}")


def _unread(trace: Trace) -> str:
    """A second line saying which committed segments the export left unread, if any (a copy
    of a trace taken while it was being recorded: ``Trace.unread_note``)."""
    return f"\nnote: {trace.unread_note}" if trace.unread_note else ""
