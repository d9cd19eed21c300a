"""benchmarks/gc_pauses.py: the collector's pauses are summed per generation (the longest
kept), and the calibration's eager probe steps are read from a trace header."""

from __future__ import annotations

import gc

from benchmarks.gc_pauses import PauseMeter, eager_calibration


def test_the_meter_sums_each_generations_pauses_and_resets() -> None:
    meter = PauseMeter()
    gc.callbacks.append(meter)
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        gc.callbacks.remove(meter)
    taken = meter.take()
    assert taken["gc_counts"][0] >= 1 and taken["gc_counts"][2] >= 1
    assert all(s >= 0 for s in taken["gc_s"]) and taken["gc_s"][2] > 0
    assert 0 < taken["gc_max_s"][2] <= taken["gc_s"][2]  # the longest of the full passes
    assert meter.take() == {"gc_s": [0.0, 0.0, 0.0], "gc_max_s": [0.0, 0.0, 0.0],
                            "gc_counts": [0, 0, 0]}


def test_the_eager_probe_steps_come_from_the_calibration() -> None:
    def row(kind: str, graph: bool, prefill: int, decode: int, seconds: float) -> dict:
        return {"kind": kind, "graph_used": graph, "prefill_tokens": prefill,
                "decode_seqs": decode, "duration_s": seconds}

    header = {"calibration": [
        row("prefill", True, 1, 0, 0.001), row("prefill", False, 1, 0, 0.0105),
        row("prefill", False, 16, 0, 0.02), row("decode", False, 0, 64, 0.0116),
        row("decode", True, 0, 64, 0.0018)]}
    assert eager_calibration(header) == {"eager_prefill_1_ms": 10.5, "eager_decode_64_ms": 11.6}
    assert eager_calibration({}) == {}


def test_a_host_stall_is_attributed_to_the_causes_that_overlap_it() -> None:
    """A step is a stall when its host time exceeds its class's median by more than 5 ms; it
    is counted under each cause whose window overlaps its span (previous end to own end) and
    as unexplained when none does; a window between two steps touches neither."""
    import numpy as np

    from benchmarks.gc_pauses import host_stalls

    host = [0.001, 0.001, 0.012, 0.001, 0.011, 0.001, 0.009, 0.030, 0.030]
    steps = {"host_s": np.array(host),
             "wall_time_s": np.array([0.01, 0.02, 0.04, 0.05, 0.07, 0.08, 0.10, 0.2, 0.3]),
             "prefill_tokens": np.array([0] * 7 + [500, 500]),
             "decode_seqs": np.array([4] * 7 + [0, 0]), "step": np.arange(9)}
    start = 100.0  # the engine clock's origin on perf_counter
    staged = [True] + [False] * 7 + [True]  # steps 0 and 8 follow a conversion to Arrow
    out = host_stalls(steps, start, {"gc": [(100.025, 0.004)], "writer": [(100.061, 0.002)],
                                     "machine": [(100.045, 0.002)]}, staged)
    # decode median 1 ms: steps 2 (12 ms), 4 (11 ms) and 6 (9 ms) stall; prefill steps share
    # one median (30 ms), so neither stalls
    assert out["stalls"] == 3 and out["steps"] == 9
    assert out["stall_host_s"] == round(0.012 + 0.011 + 0.009, 4)
    assert out["stalls_with_gc"] == 1  # inside step 2's span (0.02, 0.04]
    assert out["stalls_with_writer"] == 1  # inside step 4's span (0.05, 0.07]
    assert out["stalls_with_machine"] == 0  # in step 3's span, which is no stall
    assert out["stalls_unexplained"] == 1  # step 6
    assert out["steps_after_staging"] == 2
    assert out["stalls_after_staging"] == 0
    # per class: how many, and their host beyond the class's median (what a queue waits)
    assert out["stalls_by_class"] == {"decode": [3, round(0.011 + 0.010 + 0.008, 4)],
                                      "prefill": [0, 0.0]}


def test_the_probe_reports_its_gaps_on_the_shared_clock() -> None:
    """benchmarks.host_probe runs as its own process and writes the gaps it saw; a stop of the
    probe process (SIGSTOP for 50 ms) shows as one gap of about that length, placed on the
    perf_counter clock this process reads."""
    import os
    import signal
    import time
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from benchmarks.host_probe import HostProbe

    with TemporaryDirectory() as work:
        probe = HostProbe(Path(work) / "probe.json", gap_s=0.02, cpu=0)
        with probe:
            time.sleep(0.1)
            stopped = time.perf_counter()
            os.kill(probe._process.pid, signal.SIGSTOP)
            time.sleep(0.05)
            os.kill(probe._process.pid, signal.SIGCONT)
            time.sleep(0.2)
    long = [(begin, seconds) for begin, seconds in probe.gaps if seconds >= 0.045]
    assert long, probe.gaps
    assert any(abs(begin - stopped) < 0.05 for begin, _ in long), (stopped, long)


def test_method_windows_time_each_call_and_put_the_method_back() -> None:
    """Inside the block every call of the wrapped method is timed (its result passed through,
    a raising call timed too); after it the class has its own method again."""
    import pytest

    from benchmarks.gc_pauses import MethodWindows

    class Worker:
        def work(self, value: int) -> int:
            if value < 0:
                raise ValueError(value)
            return value * 2

    original = Worker.work
    with MethodWindows(Worker, "work") as windows:
        assert Worker().work(3) == 6
        with pytest.raises(ValueError):
            Worker().work(-1)
    assert Worker.work is original
    assert len(windows.windows) == 2 and all(seconds >= 0 for _, seconds in windows.windows)
    Worker().work(1)
    assert len(windows.windows) == 2


def test_the_deferred_variant_records_everything_with_no_recorder_work_during_the_run(
        tmp_path, monkeypatch) -> None:
    """``deferred``: no Arrow conversion and no segment write while the run goes on, yet the
    trace holds every step once the engine closes; ``unflushed`` converts but does not write;
    ``process`` writes from a child process; ``switch`` runs at the short switch interval and
    puts the interpreter's back afterwards."""
    import sys

    from benchmarks.gc_pauses import FAST_SWITCH_S, one_engine
    from engine.model.checkpoint import default_model_dir
    from replay.workloads.request import Request
    from tracing.reader import read_trace

    requests = [Request(prompt=list(range(5 + i, 20 + i)), max_tokens=12) for i in range(3)]
    # A conversion every few steps of this small run, as a full batch's events make them.
    monkeypatch.setattr("tracing.recorder.STAGE_EVENTS", 8)
    meter = PauseMeter()
    model = str(default_model_dir())
    switch_was = sys.getswitchinterval()
    rows = {}
    for variant in ("default", "deferred", "unflushed", "process", "switch"):
        rows[variant] = one_engine(model, requests, meter, True, str(tmp_path / variant),
                                   variant=variant)
        steps = read_trace(tmp_path / variant).table("model_step").num_rows
        assert steps == rows[variant]["steps"] > 0
        assert sys.getswitchinterval() == switch_was
    assert rows["deferred"]["stage_calls"] == rows["deferred"]["writer_calls"] == 0
    assert rows["unflushed"]["stage_calls"] > 0 and rows["unflushed"]["writer_calls"] == 0
    # The child process writes: the engine's process times no segment write of its own.
    assert rows["process"]["stage_calls"] > 0 and rows["process"]["writer_calls"] == 0
    assert read_trace(tmp_path / "process").summary["recorder"]["writer"] == "process"
    assert rows["default"]["handoff_calls"] == 0
    assert rows["default"]["stage_calls"] > 0  # every STAGE_EVENTS events, and each flush
    assert rows["switch"]["switch_interval_s"] == FAST_SWITCH_S
    assert rows["default"]["switch_interval_s"] == switch_was
    assert all(row["ttft_p99_ms"] >= row["ttft_mean_ms"] > 0 for row in rows.values())


def test_staged_steps_replays_the_recorders_rule_over_a_recordings_events() -> None:
    """``staged_steps`` marks the step after each point where the recorder's rule
    (``stage_due``) converted: events gather over steps until ``STAGE_EVENTS`` wait."""
    from types import SimpleNamespace

    import numpy as np

    from benchmarks.gc_pauses import staged_steps
    from tracing.recorder import STAGE_EVENTS

    half = STAGE_EVENTS // 2 + 1
    # steps 0-5; step 1 buffers half the threshold, step 2 the rest: due at step 2's end;
    # step 4 alone buffers a whole threshold: due at its end
    sampled = [1] * half + [2] * half + [4] * STAGE_EVENTS
    events = SimpleNamespace(tables={"model_step": {"step": np.arange(6)},
                                     "token_sampled": {"step": np.array(sampled)},
                                     "preempted": {"step": np.array([], np.int64)}})
    assert staged_steps(events).tolist() == [False, False, False, True, False, True]
