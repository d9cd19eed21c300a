"""Export a trace as Chrome / Perfetto trace-event JSON (open it in https://ui.perfetto.dev).

Timestamps are the run's own clock (seconds since the engine started, from ``model_step``'s
``wall_time_s`` and ``request_added``'s ``added_s`` / ``arrival_s``) in microseconds. Every
event carries ``pid`` and ``tid``; the slices of one track never overlap. The file holds:

- track "steps": one slice per engine step, from the previous step's end to this one's (the
  scheduler's and the executor's time together). While the engine is idle (no request left,
  waiting for the next arrival) there is no slice: the step after the gap starts when its first
  request was added (one rejected or aborted before any step ran it woke none; a request
  finished between steps, as an abort is, has left the engine by the next step);
- track "model": one slice per model step, ``[wall_time_s - duration_s, wall_time_s]``, named by
  its kind (prefill / decode / mixed) with the batch features and the measured ``duration_s``
  as args; a step launched before the previous one's tokens were back (overlapped) is drawn from
  the previous slice's end, so slices never overlap (its args keep the measured duration);
- track "driver" (schema 7): each step's ``outside_s`` where the step's interval starts,
  clipped to that interval (the measured value in its args);
- counters "sequences" (running, waiting) and "free KV blocks", sampled when each step begins,
  and back to no sequence and every block free when the engine is left with no request;
- one async span per request, from arrival to finish (a request still unfinished where the
  trace ends, e.g. a killed run's: to the end of its last step, reason ``unfinished``) and its
  prefix-cache hit tokens as args, with instants for when it was added, its first token and
  each preemption (at the start of the step that preempted it). A request whose ``arrival_s``
  is not a finite number (``LLM.add_request`` records what it is given) starts when it was
  added, its ``ttft_s`` null: the file is strict JSON (no NaN, which viewers refuse); so does
  a negative one (``arrivals_on_the_clock``, the rule a replay reads such an arrival by).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tracing.errors import TraceError
from tracing.inspect import header_block_size, header_num_blocks
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


# Finishes recorded between steps, carrying the number of the step after them.
_BETWEEN_STEPS = ("aborted", "stop", "rejected")


def arrivals_on_the_clock(arrival: Any, added_s: Any, added_step: Any, steps: Any,
                          step_ends: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each request's arrival as a time on the engine's clock, and which were recorded as one.

    ``arrival``, ``added_s``, ``added_step``: ``request_added``'s columns; ``steps``,
    ``step_ends``: ``model_step``'s ``step`` and ``wall_time_s`` (in step order). An arrival
    that is not a finite number >= 0 (a trace recorded before the engine refused them:
    ``LLM.add_request`` recorded what it was given) stands in as when the engine added the
    request (``added_s``, schema 7), else the end of the model step before the request's step,
    else 0. The one rule for the export's spans and for what a replay or what-if hands back to
    ``EngineCore.add_request`` (``replay.recorded``)."""
    times = np.asarray(arrival, dtype=float)
    measured = np.isfinite(times) & (times >= 0)
    if measured.all():
        return times, measured
    bad = ~measured
    ends = np.asarray(step_ends, dtype=float)
    before = np.searchsorted(np.asarray(steps), np.asarray(added_step)[bad]) - 1
    fallback = (np.where(before >= 0, ends[np.maximum(before, 0)], 0.0) if len(ends)
                else np.zeros(int(bad.sum())))
    added = np.asarray(added_s, dtype=float)[bad]
    fixed = np.where(np.isfinite(added) & (added >= 0), added, fallback)
    times = times.copy()
    times[bad] = np.where(np.isfinite(fixed) & (fixed >= 0), fixed, 0.0)
    return times, measured


def _departures(added: Any, finished: Any) -> tuple[np.ndarray, set[int]]:
    """For each finished request, the first step it is no longer in the engine for: the step
    after the one it finished in, or, for a finish recorded between steps (an abort, a stop
    string, a rejection: ``_BETWEEN_STEPS``, carrying the next step's number), that step itself;
    never before the step after its arrival's. And the requests dropped between the steps
    around their arrival (rejected, or aborted while waiting), which woke no step."""
    added_step = dict(zip(np.asarray(added.column("seq_id")).tolist(),
                          np.asarray(added.column("step"), dtype=np.int64).tolist()))
    gone, dropped = [], set()
    for seq_id, step, reason in zip(np.asarray(finished.column("seq_id")).tolist(),
                                    np.asarray(finished.column("step"), np.int64).tolist(),
                                    finished.column("reason").to_pylist()):
        between = reason in _BETWEEN_STEPS
        arrived = added_step.get(seq_id, step)
        if between and step == arrived:
            dropped.add(seq_id)
        gone.append(max(step if between else step + 1, arrived + 1))
    return np.asarray(gone, dtype=np.int64), dropped


def _meta(name: str, tid: int, value: str) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": _PID, "tid": tid, "args": {"name": value}}


class _Timeline:
    """Each step's interval on the steps track, its end, and the moments the engine emptied."""

    def __init__(self, trace: Trace) -> None:
        ms = trace.table("model_step")
        self.steps = np.asarray(ms.column("step")).tolist()
        ends = np.asarray(ms.column("wall_time_s"), dtype=float).tolist()
        added = trace.table("request_added")
        add_steps = np.asarray(added.column("step"), dtype=np.int64)
        when = np.asarray(added.column("arrival_s"), dtype=float)
        if "added_s" in added.column_names:  # schema 7: when the engine began adding it
            added_s = np.asarray(added.column("added_s"), dtype=float)
            when = np.where(np.isfinite(added_s), added_s, when)
        gone, dropped = _departures(added, trace.table("request_finished"))
        woken: dict[int, float] = {}
        for seq_id, step, t in zip(np.asarray(added.column("seq_id")).tolist(),
                                   add_steps.tolist(), when.tolist()):
            if np.isfinite(t) and seq_id not in dropped:
                woken[step] = min(woken.get(step, t), t)
        add_sorted = np.sort(add_steps)
        gone_sorted = np.sort(gone)
        self.start_of: dict[int, float] = {}
        self.end_of: dict[int, float] = {}
        self.emptied: list[float] = []  # when the engine was left with no request
        previous = 0.0
        for step, end in zip(self.steps, ends):
            start = previous
            left = (int(np.searchsorted(add_sorted, step))
                    - int(np.searchsorted(gone_sorted, step, side="right")))
            if left == 0:  # no request left before this step: it waited for one to arrive
                start = max(previous, woken.get(step, previous))
                if start > previous:
                    self.emptied.append(previous)
            self.start_of[step] = min(start, end)
            self.end_of[step] = end
            previous = max(previous, end)
        if self.steps and len(add_sorted) == len(gone_sorted):
            self.emptied.append(previous)
        self._sorted = sorted(self.end_of)

    def end_by(self, step: int, fallback: float) -> float:
        """End of ``step``, or of the last step before it; ``fallback`` if there is none."""
        i = bisect.bisect_right(self._sorted, step)
        return self.end_of[self._sorted[i - 1]] if i else fallback

    @property
    def last_end(self) -> float:
        return max(self.end_of.values()) if self.end_of else 0.0


def _counters(ts: float, running: int, waiting: int, free: int | None) -> list[dict[str, Any]]:
    out = [{"ph": "C", "name": "sequences", "pid": _PID, "tid": _TID_STEPS, "ts": ts * _US,
            "args": {"running": running, "waiting": waiting}}]
    if free is not None:
        out.append({"ph": "C", "name": "free KV blocks", "pid": _PID, "tid": _TID_STEPS,
                    "ts": ts * _US, "args": {"free": free}})
    return out


def perfetto_events(trace: Trace) -> list[dict[str, Any]]:
    """The trace-event list ``export_perfetto`` writes (useful to post-process or test)."""
    events: list[dict[str, Any]] = [
        _meta("process_name", _TID_STEPS, "replayllm engine"),
        _meta("thread_name", _TID_STEPS, "steps"),
        _meta("thread_name", _TID_MODEL, "model"),
        _meta("thread_name", _TID_DRIVER, "driver"),
    ]
    timeline = _Timeline(trace)
    model_end = 0.0
    for row in trace.table("model_step").to_pylist():
        step, end = row["step"], row["wall_time_s"]
        step_start = timeline.start_of[step]
        events.append({"ph": "X", "name": f"step {step}", "pid": _PID, "tid": _TID_STEPS,
                       "ts": step_start * _US, "dur": max(end - step_start, 0.0) * _US,
                       "args": {"step": step, "kind": row["kind"]}})
        # The device runs one step after the other: an overlapped step whose measured start
        # falls before the previous step's tokens were back is drawn from there.
        begin = min(max(end - row["duration_s"], model_end), end)
        model_end = max(model_end, end)
        events.append({"ph": "X", "name": row["kind"], "pid": _PID, "tid": _TID_MODEL,
                       "ts": begin * _US, "dur": (end - begin) * _US,
                       "args": {"step": step, "duration_s": row["duration_s"],
                                **{k: row[k] for k in _MODEL_ARGS}}})
        outside = row.get("outside_s")
        if outside is not None and np.isfinite(outside) and outside > 0:
            # The driver's work before the step (schema 7), drawn where the step's interval
            # starts: it ran after the previous step's post-processing, before this schedule.
            events.append({"ph": "X", "name": "driver", "pid": _PID, "tid": _TID_DRIVER,
                           "ts": step_start * _US,
                           "dur": max(min(outside, end - step_start), 0.0) * _US,
                           "args": {"step": step, "outside_s": outside}})
    for row in trace.table("batch_scheduled").to_pylist():
        ts = timeline.start_of.get(row["step"])
        if ts is not None:
            events += _counters(ts, row["num_running"], row["num_waiting"], row["free_blocks"])
    num_blocks = header_num_blocks(trace.header)
    for ts in timeline.emptied:  # nothing running or waiting: every block is free
        events += _counters(ts, 0, 0, num_blocks)
    events += _request_spans(trace, timeline)
    for event in events:  # strict JSON: a non-finite measurement in args becomes null
        args = event.get("args")
        if args and any(isinstance(v, float) and not math.isfinite(v) for v in args.values()):
            event["args"] = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                             for k, v in args.items()}
    return events


def _request_spans(trace: Trace, timeline: _Timeline) -> list[dict[str, Any]]:
    added = trace.table("request_added")
    seq_ids = np.asarray(added.column("seq_id")).tolist()
    # When the engine began adding each request (schema 7; NaN before): its lag after arrival.
    added_at = (dict(zip(seq_ids, added.column("added_s").to_pylist()))
                if "added_s" in added.column_names else {})
    steps = trace.table("model_step")
    times, measured = arrivals_on_the_clock(
        added.column("arrival_s"), [added_at.get(i, math.nan) for i in seq_ids],
        added.column("step"), steps.column("step"), steps.column("wall_time_s"))
    arrival = dict(zip(seq_ids, zip(times.tolist(), measured.tolist())))
    sampled = trace.table("token_sampled")
    first_step: dict[int, int] = {}
    generated: dict[int, int] = {}
    for seq_id, step in zip(
        np.asarray(sampled.column("seq_id")).tolist(), np.asarray(sampled.column("step")).tolist()
    ):
        first_step.setdefault(seq_id, step)
        generated[seq_id] = generated.get(seq_id, 0) + 1
    finished = {row["seq_id"]: row for row in trace.table("request_finished").to_pylist()}
    block_size = header_block_size(trace.header)
    hit_tokens: dict[int, int] = {}
    for seq_id in np.asarray(trace.table("block_hit").column("seq_id")).tolist():
        hit_tokens[seq_id] = hit_tokens.get(seq_id, 0) + (block_size or 0)
    out: list[dict[str, Any]] = []
    for row in trace.table("preempted").to_pylist():  # an instant in the preempted request's span
        out.append({"cat": "request", "id": row["seq_id"], "pid": _PID, "tid": _TID_STEPS,
                    "ph": "n", "name": "preempted",
                    "ts": timeline.start_of.get(row["step"], timeline.end_by(row["step"], 0.0))
                    * _US,
                    "args": {k: row[k] for k in ("step", "blocks_released", "for_seq_id",
                                                 "num_tokens")}})
    for seq_id in seq_ids:
        # An arrival_s given as NaN, infinity or negative (LLM.add_request took it) is drawn
        # from its stand-in (arrivals_on_the_clock), its TTFT unknown.
        began, measured = arrival[seq_id]
        added_s = added_at.get(seq_id)
        row = finished.get(seq_id)
        if row is None:  # still running or waiting where the trace ends (a killed run)
            ended = max(timeline.last_end, began)
            args: dict[str, Any] = {"reason": "unfinished",
                                    "completion_tokens": generated.get(seq_id, 0)}
        else:
            step = row["step"]
            if row["reason"] in _BETWEEN_STEPS:  # recorded before step ``step``, after the last
                step -= 1
            ended = max(timeline.end_by(step, began), began)
            args = {"reason": row["reason"], "completion_tokens": row["num_completion_tokens"]}
        if isinstance(block_size, int):  # tokens served from the prefix cache, all admissions
            args["prefix_cache_hit_tokens"] = hit_tokens.get(seq_id, 0)
        common = {"cat": "request", "id": seq_id, "pid": _PID, "tid": _TID_STEPS,
                  "name": f"request {seq_id}"}
        if added_s is not None and np.isfinite(added_s):
            ended = max(ended, added_s)  # a request rejected as it was added: its span holds it
            out.append({**common, "ph": "n", "name": "added", "ts": added_s * _US})
        if seq_id in first_step:
            first = timeline.end_by(first_step[seq_id], began)
            args["ttft_s"] = first - began if measured else None
            out.append({**common, "ph": "n", "name": "first token", "ts": first * _US})
        out.append({**common, "ph": "b", "ts": began * _US, "args": args})
        out.append({**common, "ph": "e", "ts": ended * _US})
    out.sort(key=lambda e: (e["ts"], e["ph"] != "b"))
    return out


def perfetto_json(trace: Trace) -> bytes:
    """The document ``export_perfetto`` writes, as strict JSON bytes (``TraceError`` for a
    model step time that is not a finite number: viewers refuse NaN)."""
    document = {
        "traceEvents": perfetto_events(trace),
        "displayTimeUnit": "ms",
        "otherData": {
            "trace": str(trace.path),
            "complete": trace.complete,
            "last_step": trace.last_step,
        },
    }
    try:
        return json.dumps(document, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except ValueError:  # NaN is not JSON: a viewer would refuse the whole file
        raise TraceError(f"{trace.path}: cannot export: a model step's wall_time_s or "
                         "duration_s is not a finite number (a damaged trace)") from None


def export_perfetto(trace: Trace, out_path: str | Path, force: bool = False) -> Path:
    """Write ``trace`` as Chrome trace-event JSON to ``out_path``; return the path written.

    The file is written under a temporary name and renamed: a full disk leaves no partial file.
    An existing file is replaced only if it is an earlier export, or with ``force``; a
    directory, a symlink or a file inside the trace's own data never is.
    """
    out = Path(out_path)
    check_export_path(trace, out, force)
    data = perfetto_json(trace)
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
