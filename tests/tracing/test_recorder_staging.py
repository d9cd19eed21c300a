"""When the recorder converts buffered events to Arrow on the engine's thread.

Before: every 8th step's end converted the last 8 steps' events, whatever their number. A
conversion costs ~1 ms on the device hosts, so in light traffic (decodes of a few rows, ~1 ms
of device time each) every 8th step's host work outran its device time: chat and conversation
recordings on the H100 and the H200 carry a host tail at exactly ``step % 8 == 0``
(docs/gpu-notes.md, session 36). Now the conversion waits for ``STAGE_EVENTS`` buffered events
(``stage_due``): a full batch still converts every few steps, a light one at its segment
flushes only, and the trace's rows are the same either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from _trace_helpers import Req, Workload, expected_pydict, in_memory, run_engine

from tracing import read_trace
from tracing.recorder import STAGE_EVENTS, ParquetRecorder, stage_due
from tracing.schema import EVENT_KINDS, MEASURED_COLUMNS


def _recording(tmp_path: Path, workload: Workload, **settings: Any) -> tuple[Path, list[int]]:
    """Record ``workload``; the step index (the buffer's step counter) at each conversion."""
    trace = tmp_path / "trace"
    recorder = ParquetRecorder(trace, flush_steps=256, flush_seconds=3600.0, fsync=False)
    for name, value in settings.items():
        setattr(recorder, name, value)
    converted_at: list[int] = []
    stage = recorder._stage
    current: dict[str, Any] = {}

    def on_step_end(buffer: Any, inner: Any = recorder.on_step_end) -> None:
        current["step"] = buffer.step
        inner(buffer)

    def counted(tables: dict[str, dict[str, list]]) -> None:
        if any(len(cols["event_id"]) for cols in tables.values()):
            converted_at.append(current.get("step", -1))
        stage(tables)

    recorder._stage = counted  # type: ignore[method-assign]
    recorder.on_step_end = on_step_end  # type: ignore[method-assign]
    run_engine(workload, recorder)
    return trace, converted_at


LIGHT = Workload([Req([1, 2, 3, 4, 5], 60), Req([6, 7, 8], 60)], num_blocks=80)


def test_light_traffic_converts_at_flushes_not_every_eighth_step(tmp_path: Path) -> None:
    """Two sequences decoding 60 tokens (~4 events a step): no conversion is due before the
    run's single flush at its close, where the old rule converted at every 8th step (7
    conversions mid-run)."""
    trace, converted_at = _recording(tmp_path, LIGHT)
    steps = read_trace(trace).table("model_step").num_rows
    assert steps >= 59
    assert len(converted_at) <= 1, converted_at  # the close's flush only


def test_a_full_batch_converts_once_its_events_are_due(tmp_path: Path) -> None:
    """With the threshold at 40 events, a run converts each time 40 have gathered: the
    conversions fall where ``stage_due`` says, every few steps, not once at the end."""
    trace, converted_at = _recording(tmp_path, LIGHT, stage_events=40)
    rows = read_trace(trace)
    per_step = np.zeros(rows.table("model_step").num_rows + 2, np.int64)
    for kind in EVENT_KINDS:
        at = np.asarray(rows.table(kind).column("step").to_pylist(), np.int64)
        np.add.at(per_step, np.clip(at, 0, len(per_step) - 1), 1)
    pending, due = 0, []
    for step in range(len(per_step) - 1):
        pending += int(per_step[step])
        if stage_due(pending, 40):
            due.append(step + 1)
            pending = 0
    assert len(converted_at) >= 5
    assert converted_at[: len(due)] == due[: len(converted_at)]


def test_the_rows_do_not_depend_on_when_they_were_converted(tmp_path: Path) -> None:
    """A recording converting at every step and one converting only at its flushes hold the
    same events as the in-memory sink (measured times aside)."""
    memory = in_memory(LIGHT)
    for name, stage_events in (("each", 1), ("deferred", 10**9)):
        trace, _ = _recording(tmp_path / name, LIGHT, stage_events=stage_events)
        read = read_trace(trace)
        for kind in EVENT_KINDS:
            got = read.table(kind).to_pydict()
            want = expected_pydict(kind, memory.tables[kind])
            for column in want:
                if column not in MEASURED_COLUMNS.get(kind, ()):
                    assert got[column] == want[column], (name, kind, column)


def test_stage_due_is_a_count_of_events() -> None:
    """The rule: due once ``STAGE_EVENTS`` events wait (about 8 steps of the reference's
    256-row decodes), not before."""
    assert not stage_due(STAGE_EVENTS - 1)
    assert stage_due(STAGE_EVENTS)
    assert 3000 <= STAGE_EVENTS <= 8192
