"""Export a trace as Chrome / Perfetto trace-event JSON (open it in https://ui.perfetto.dev).

Timestamps are the run's own clock (seconds since the engine started, from ``model_step``'s
``wall_time_s`` and ``request_added``'s ``arrival_s``) in microseconds. The file holds:

- track "model": one slice per model step, ``[wall_time_s - duration_s, wall_time_s]``, named by
  its kind (prefill / decode / mixed) with the batch features as args;
- track "steps": one slice per engine step, from the previous step's end to this one's (the
  scheduler's and the executor's time together);
- counters "sequences" (running, waiting) and "free KV blocks", sampled when each step begins;
- one async span per request, from arrival to finish, with its time to first token as an
  instant inside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tracing.errors import TraceError
from tracing.layout import EXPORT_FILE
from tracing.outdir import describe_os_error, write_file_atomic
from tracing.outfile import check_output_file, starts_with
from tracing.reader import Trace

_US = 1e6
_EXPORT_START = b'{"traceEvents":'
_PID = 1
_TID_STEPS = 1
_TID_MODEL = 2
_TID_DRIVER = 3
_MODEL_ARGS = (
    "num_seqs",
    "prefill_tokens",
    "prefill_attn_work",
    "decode_seqs",
    "decode_context_tokens",
    "padded_batch_size",
    "padded_tokens",
    "graph_used",
)


def _meta(name: str, tid: int, value: str) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": _PID, "tid": tid, "args": {"name": value}}


def _step_times(trace: Trace) -> tuple[dict[int, float], dict[int, float]]:
    """Per step: (start, end) in seconds, start being the previous step's end."""
    ms = trace.table("model_step")
    steps = np.asarray(ms.column("step")).tolist()
    ends = np.asarray(ms.column("wall_time_s")).tolist()
    starts: dict[int, float] = {}
    end_of: dict[int, float] = {}
    previous = 0.0
    for step, end in zip(steps, ends):
        starts[step] = min(previous, end)
        end_of[step] = end
        previous = end
    return starts, end_of


def _time_at_step_end(end_of: dict[int, float], step: int, fallback: float) -> float:
    """End of ``step``, or of the last step before it (events between steps, e.g. aborts)."""
    if step in end_of:
        return end_of[step]
    earlier = [s for s in end_of if s < step]
    return end_of[max(earlier)] if earlier else fallback


def perfetto_events(trace: Trace) -> list[dict[str, Any]]:
    """The trace-event list ``export_perfetto`` writes (useful to post-process or test)."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": _PID, "args": {"name": "replayllm engine"}},
        _meta("thread_name", _TID_STEPS, "steps"),
        _meta("thread_name", _TID_MODEL, "model"),
        _meta("thread_name", _TID_DRIVER, "driver"),
    ]
    starts, end_of = _step_times(trace)
    ms = trace.table("model_step").to_pylist()
    for row in ms:
        end = row["wall_time_s"]
        step_start = starts[row["step"]]
        events.append(
            {
                "ph": "X",
                "name": f"step {row['step']}",
                "pid": _PID,
                "tid": _TID_STEPS,
                "ts": step_start * _US,
                "dur": max(end - step_start, 0.0) * _US,
                "args": {"step": row["step"], "kind": row["kind"]},
            }
        )
        events.append(
            {
                "ph": "X",
                "name": row["kind"],
                "pid": _PID,
                "tid": _TID_MODEL,
                "ts": (end - row["duration_s"]) * _US,
                "dur": row["duration_s"] * _US,
                "args": {"step": row["step"], **{k: row[k] for k in _MODEL_ARGS}},
            }
        )
        outside = row.get("outside_s")
        if outside is not None and np.isfinite(outside) and outside > 0:
            # The driver's work before the step (schema 7), drawn where the step's interval
            # starts: it ran after the previous step's post-processing, before this schedule.
            events.append({"ph": "X", "name": "driver", "pid": _PID, "tid": _TID_DRIVER,
                           "ts": step_start * _US, "dur": outside * _US,
                           "args": {"step": row["step"], "outside_s": outside}})
    for row in trace.table("batch_scheduled").to_pylist():
        ts = starts.get(row["step"])
        if ts is None:
            continue
        events.append(
            {
                "ph": "C",
                "name": "sequences",
                "pid": _PID,
                "ts": ts * _US,
                "args": {"running": row["num_running"], "waiting": row["num_waiting"]},
            }
        )
        events.append(
            {
                "ph": "C",
                "name": "free KV blocks",
                "pid": _PID,
                "ts": ts * _US,
                "args": {"free": row["free_blocks"]},
            }
        )
    events += _request_spans(trace, end_of)
    return events


def _request_spans(trace: Trace, end_of: dict[int, float]) -> list[dict[str, Any]]:
    added = trace.table("request_added")
    arrival = dict(
        zip(np.asarray(added.column("seq_id")).tolist(), added.column("arrival_s").to_pylist())
    )
    # When the engine began adding each request (schema 7; NaN before): its lag after arrival.
    added_at = (dict(zip(np.asarray(added.column("seq_id")).tolist(),
                         added.column("added_s").to_pylist()))
                if "added_s" in added.column_names else {})
    sampled = trace.table("token_sampled")
    first_step: dict[int, int] = {}
    for seq_id, step in zip(
        np.asarray(sampled.column("seq_id")).tolist(), np.asarray(sampled.column("step")).tolist()
    ):
        first_step.setdefault(seq_id, step)
    out: list[dict[str, Any]] = []
    for row in trace.table("request_finished").to_pylist():
        seq_id = row["seq_id"]
        began = arrival.get(seq_id, 0.0)
        ended = max(_time_at_step_end(end_of, row["step"], began), began)
        common = {"cat": "request", "id": seq_id, "pid": _PID, "name": f"request {seq_id}"}
        args = {
            "reason": row["reason"],
            "completion_tokens": row["num_completion_tokens"],
        }
        added_s = added_at.get(seq_id)
        if added_s is not None and np.isfinite(added_s):
            ended = max(ended, added_s)  # a request rejected as it was added: its span holds it
            out.append({**common, "ph": "n", "name": "added", "ts": added_s * _US})
        if seq_id in first_step:
            first = _time_at_step_end(end_of, first_step[seq_id], began)
            args["ttft_s"] = first - began
            out.append({**common, "ph": "n", "name": "first token", "ts": first * _US})
        out.append({**common, "ph": "b", "ts": began * _US, "args": args})
        out.append({**common, "ph": "e", "ts": ended * _US})
    out.sort(key=lambda e: (e["ts"], e["ph"] != "b"))
    return out


def export_perfetto(trace: Trace, out_path: str | Path, force: bool = False) -> Path:
    """Write ``trace`` as Chrome trace-event JSON to ``out_path``; return the path written.

    The file is written under a temporary name and renamed: a full disk leaves no partial file.
    An existing file is replaced only if it is an earlier export, or with ``force``; a
    directory, a symlink or a file inside the trace's own data never is.
    """
    out = Path(out_path)
    check_export_path(trace, out, force)
    document = {
        "traceEvents": perfetto_events(trace),
        "displayTimeUnit": "ms",
        "otherData": {
            "trace": str(trace.path),
            "complete": trace.complete,
            "last_step": trace.last_step,
        },
    }
    data = json.dumps(document, separators=(",", ":")).encode("utf-8")
    try:
        write_file_atomic(out, data)
    except OSError as exc:
        raise TraceError(f"{out}: cannot write ({describe_os_error(exc)}); "
                         "nothing was left there") from None
    return out


def check_export_path(trace: Trace, out: Path, force: bool, own_name: str = EXPORT_FILE,
                      is_earlier: Callable[[Path], bool] | None = None) -> None:
    """Raise ``OutputDirError`` unless an export of ``trace`` may be written at ``out``
    (``tracing.outfile.check_output_file``): inside the trace only under ``own_name``."""
    check_output_file(out, "export", is_earlier or starts_with(_EXPORT_START), force,
                      own_dir=trace.path,
                      own_names=frozenset({own_name}))
