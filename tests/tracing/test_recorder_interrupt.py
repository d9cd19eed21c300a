"""Ctrl-C (``KeyboardInterrupt``) landing inside the recorder's own staging and flushing.

Before: ``on_step_end`` / ``on_idle`` / ``close`` drained the engine's buffer (its tables swapped
for fresh ones), converted the rows kind by kind into the staged tables, cut a segment and
handed it to the writer over several statements each; a ``KeyboardInterrupt`` between two of
them lost the rows just drained (the engine's ``close`` then committed a trace missing whole
steps' events) or left ``num_segments`` past a segment never handed over. Now the recorder's
state changes run with SIGINT deferred (``tracing/interrupt_guard.py``): Ctrl-C lands when
they are done, and the ``close`` that follows commits every whole step, exactly once.

The signal is raised for real (``signal.raise_signal``, as a terminal's Ctrl-C arrives) from a
trace function at each line, in turn, of the recorder's code (every module of ``tracing``) run
by one step end, one idle check or the close; each run's trace is then read, checked against a
reference recording of the same workload and verified.
"""

from __future__ import annotations

import signal
import sys
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from _trace_helpers import FakeClock, Req, Workload, _params, in_memory

from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from replay.verify import verify
from tracing import TraceError, interrupt_guard, read_trace
from tracing.recorder import ParquetRecorder
from tracing.schema import EVENT_KINDS, MEASURED_COLUMNS

TRACING = Path(__file__).resolve().parents[2] / "tracing"
# Where rows and segments change hands (Arrow conversion and file encoding hold no state, and
# would make thousands of lines to interrupt at).
MODULES = {str(TRACING / name) for name in ("recorder.py", "events.py", "interrupt_guard.py")}
WRITER = {str(TRACING / name) for name in ("segment_writer.py", "segment_process.py")}
WRITER_CODE = {"submit", "drain", "write", "_write_segment_files", "_send", "_receive",
               "_take_answer", "shutdown"}
WORKLOAD = Workload([Req([1, 2, 3, 4, 5, 6, 7, 8, 9], 9), Req([1, 2, 3, 4, 5, 6, 7, 8, 10], 12),
                     Req([11, 12, 13], 6), Req(list(range(20, 41)), 8)], num_blocks=40)
STEP = 7  # the step end interrupted: it stages (every step) and flushes (every 4)
IDLE = 5  # the step after which the engine waits (``on_idle``, flushing on its time limit)


SAMPLED = 24  # lines interrupted at where Ctrl-C is not deferred (all of them after the fix)
DEFERRED = 6  # and where it is


class Injector:
    """A trace function raising SIGINT at the ``at``-th line run in the recorder's code; it
    notes which lines ran with the signal deferred (``live``: the others)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.lines = 0
        self.fired = False
        self.live: list[int] = []
        self.deferred: list[int] = []

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event == "call" and (code.co_filename in MODULES or (
                code.co_filename in WRITER and code.co_name in WRITER_CODE)):
            return self._line
        return None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            deferred = signal.getsignal(signal.SIGINT) is interrupt_guard._note
            (self.deferred if deferred else self.live).append(self.lines)
            if self.lines == self.at and not self.fired:
                self.fired = True
                signal.raise_signal(signal.SIGINT)  # the handler raises here, or defers it
            self.lines += 1
        return self._line


@contextmanager
def traced(injector: Injector | None) -> Iterator[None]:
    if injector is None:
        yield
        return
    sys.settrace(injector)
    try:
        yield
    finally:
        sys.settrace(None)


def _run(trace: Path, where: str, injector: Injector | None, writer: str) -> bool:
    """Record ``WORKLOAD``, ``injector`` armed in the recorder's ``where`` call; a
    ``KeyboardInterrupt`` stops the run, and the engine is closed as ``LLM.close`` does then.
    True when interrupted."""
    recorder = ParquetRecorder(trace, flush_steps=4, flush_seconds=3600.0, fsync=False,
                               background=writer != "inline", writer="process"
                               if writer == "process" else "thread")
    recorder.stage_events = 1  # a conversion at every step's end, between the flushes
    arm = {"step": (recorder, "on_step_end", STEP), "idle": (recorder, "on_idle", 0),
           "close": (recorder, "close", 0)}[where]
    _arm(*arm, injector)
    config = WORKLOAD.config()
    core = EngineCore(config, NullExecutor(WORKLOAD.num_blocks, vocab_size=1000), sink=recorder,
                      header={"model": {"architecture": "null"}, "device": "cpu: test"},
                      clock=FakeClock())
    for req in WORKLOAD.requests:
        core.add_request(req.prompt, _params(req))
    try:
        while core.has_unfinished():
            core.step()
            if core.step_index == IDLE + 1 and where == "idle":
                recorder.flush_seconds = 0.0
                recorder.on_idle(core.events)
                recorder.flush_seconds = 3600.0
    except KeyboardInterrupt:
        core.close(interrupted=True)
        return True
    try:
        core.close()
    except KeyboardInterrupt:  # (the program's exit, or its ``finally``, closes again)
        core.close(interrupted=True)
        return True
    return False


def _arm(target: Any, name: str, call: int, injector: Injector | None) -> None:
    original: Callable[..., Any] = getattr(target, name)
    calls = iter(range(10**6))

    def armed(*args: Any, **kwargs: Any) -> Any:
        with traced(injector if next(calls) == call else None):
            return original(*args, **kwargs)

    setattr(target, name, armed)


def _rows(tables: dict[str, dict[str, list]], through: int) -> dict[str, list[tuple]]:
    """Each kind's rows of steps <= ``through`` (measurements left out), in event-id order."""
    out = {}
    for kind in EVENT_KINDS:
        cols = {n: v for n, v in tables[kind].items() if n not in MEASURED_COLUMNS}
        rows = [tuple(map(_plain, r)) for r in zip(*cols.values(), strict=True)]
        steps = list(cols["step"])
        out[kind] = sorted(r for r, s in zip(rows, steps, strict=True) if s <= through)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, (list, np.ndarray, array)):  # an int32 array prompt in memory
        return tuple(int(v) for v in value)
    return round(float(value), 5) if isinstance(value, float) else value


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, list]]:
    return in_memory(WORKLOAD).tables


def _check(trace: Path, reference: dict[str, dict[str, list]], least_step: int) -> None:
    """Every whole step through the trace's ``last_step`` (at least ``least_step``) committed,
    each row once, as the reference recorded it; ``verify`` accepts it."""
    got = read_trace(trace)
    through = got.last_step
    assert through >= least_step, (through, least_step)
    tables = {kind: got.table(kind).to_pydict() for kind in EVENT_KINDS}
    ids = got.events().column("event_id").to_pylist()
    assert len(ids) == len(set(ids)), "duplicated rows"
    assert _rows(tables, through) == _rows(reference, through), "rows lost or changed"
    assert tables["model_step"]["step"][: through + 1] == list(range(through + 1))
    result = verify(trace)
    assert result.identical, result.report()
    assert result.last_step == through


def _points(tmp_path: Path, where: str, writer: str) -> list[int]:
    """The lines to interrupt at: up to ``SAMPLED`` where a signal would raise at once (evenly
    spread), and ``DEFERRED`` where it is deferred (they all end alike)."""
    injector = Injector(-1)
    assert not _run(tmp_path / "count", where, injector, writer)
    assert injector.lines > 20

    def spread(lines: list[int], count: int) -> list[int]:
        return sorted({lines[i * (len(lines) - 1) // max(count - 1, 1)]
                       for i in range(count)}) if lines else []

    return sorted(set(spread(injector.live, SAMPLED) + spread(injector.deferred, DEFERRED)))


@pytest.mark.parametrize(("where", "writer"), [("step", "inline"), ("step", "thread"),
                                               ("idle", "thread"), ("close", "inline"),
                                               ("close", "process")])
def test_ctrl_c_at_any_line_of_the_recorder_keeps_every_whole_step_once(
        tmp_path: Path, reference: dict[str, dict[str, list]], where: str, writer: str) -> None:
    """Ctrl-C in the step end of step ``STEP`` (staging and flushing), the idle flush after step
    ``IDLE`` or the close, at each line: the close that follows commits every step taken (the
    interrupted step end's included: its step was over), each row once, and verify accepts it.
    Before: rows drained and not yet staged were lost, or a segment was counted and never
    handed over (the trace unreadable past the gap)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        points = _points(tmp_path, where, writer)
        last = max(reference["model_step"]["step"])
        least = {"step": STEP, "idle": IDLE, "close": last}[where]
        for at in points:
            trace = tmp_path / f"t{at}"
            injector = Injector(at)
            interrupted = _run(trace, where, injector, writer)
            assert interrupted == injector.fired, at
            if not injector.fired:
                # A background writer finished sooner this time, so collecting its writes ran
                # fewer lines (a thread's finished future, a process's answers in fewer reads).
                assert writer != "inline" and injector.lines <= at, (at, injector.lines)
                continue
            try:
                _check(trace, reference, least)
            except (AssertionError, TraceError) as exc:
                raise AssertionError(f"Ctrl-C at line {at} ({len(points)} tried): "
                                     f"{exc}") from None
    finally:
        signal.signal(signal.SIGINT, previous)
