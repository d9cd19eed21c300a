"""Python's garbage collector inside engine runs: how long its pauses take, and what they do to
launch-bound (eager) steps.

An eager step launches every kernel from Python, so its time follows the host; the start-up
calibration (``engine/calibration.py``) times the same eager steps at every engine start, which
makes it a probe of the host's state. This runs several engines one after another in one process,
as ``benchmarks.matrix record`` does (three warm-up engines, then recordings), and reports per
engine: the calibration's eager 1-token prefill and 64-row eager decode, the collector's pauses
(``gc.callbacks``: count, total and longest seconds of each generation, during start-up and
during the run) and the objects it tracks. The engines run ``Config.freeze_gc_heap``'s default
(the start-up heap frozen, ``engine/gc_heap.py``); ``--unfrozen`` records as many engines with it
off first, in the same process. ``--workload FILE`` runs a workload file (``replayllm workload``,
e.g. the matrix's chat family, whose long runs meet full collections) instead of the reference.

Each recording's host stalls (``host_stalls``: steps whose host time exceeds their class's median
by more than 5 ms) are counted beside what overlaps them: a collector pause, the trace writer's
segment writes, the recorder's conversions of events to Arrow (``stage``), and with ``--probe``
a gap of ``benchmarks.host_probe`` (the machine's own stalls, seen by a process on its own CPU);
also the hypervisor's steal time and the engine thread's involuntary context switches.
``--variants default,deferred,...`` interleaves ordinary recordings with ones whose recorder
keeps every event in memory until the run ends (``deferred``: no conversions, no segment writes
while it runs; stalls that remain are the engine's without its recorder), converts as usual but
writes no segment until the end (``unflushed``), writes its segments from a child process
(``process``, ``tracing.segment_process``), or runs with the interpreter's thread switch interval
at ``FAST_SWITCH_S`` (``switch``: a thread that wants the GIL back from the trace writer's threads
waits that long, not 5 ms, before the holder must give it up). Each row names Arrow's memory
pool (``ARROW_DEFAULT_MEMORY_POOL=system`` in the environment swaps it for malloc).

    python -m benchmarks.gc_pauses --model DIR [--engines 4] [--unfrozen] [--requests N]
        [--workload FILE] [--probe] [--variants default,deferred,...] [--warm-ups 3]
        [--json FILE]
    python -m benchmarks.gc_pauses --traces TRACE [TRACE ...]   # recordings' stalls only
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# A collector pause at least this long is kept with its time (to line up with the steps).
LOGGED_PAUSE_S = 0.0005
# A step whose host time exceeds its class's median by more than this is a host stall.
STALL_S = 0.005
# The switch interval of ``--variants switch`` (the interpreter's default is 5 ms).
FAST_SWITCH_S = 0.0005
VARIANTS = ("default", "deferred", "unflushed", "process", "switch")


class PauseMeter:
    """Sums the collector's pauses per generation, and keeps the longest (``gc.callbacks``) and
    each pause of at least ``LOGGED_PAUSE_S`` as (perf_counter start, seconds, generation)."""

    def __init__(self) -> None:
        self.began = 0.0
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self.pauses: list[tuple[float, float, int]] = []

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.began = time.perf_counter()
        else:
            generation = info["generation"]
            pause = time.perf_counter() - self.began
            self.seconds[generation] += pause
            self.longest[generation] = max(self.longest[generation], pause)
            self.counts[generation] += 1
            if pause >= LOGGED_PAUSE_S:
                self.pauses.append((self.began, pause, generation))

    def take(self) -> dict[str, Any]:
        out = {"gc_s": [round(s, 4) for s in self.seconds],
               "gc_max_s": [round(s, 4) for s in self.longest], "gc_counts": list(self.counts)}
        self.seconds, self.longest, self.counts = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0, 0, 0]
        return out


def eager_calibration(header: dict[str, Any]) -> dict[str, float]:
    """The calibration's eager 1-token prefill and 64-row decode, in milliseconds."""
    out = {}
    for row in header.get("calibration") or []:
        if row["graph_used"]:
            continue
        if row["kind"] == "prefill" and row["prefill_tokens"] == 1:
            out["eager_prefill_1_ms"] = round(row["duration_s"] * 1e3, 2)
        if row["kind"] == "decode" and row["decode_seqs"] == 64:
            out["eager_decode_64_ms"] = round(row["duration_s"] * 1e3, 2)
    return out


def host_stalls(steps: dict[str, Any], start_time: float,
                causes: dict[str, list[tuple[float, float]]],
                staged: Any = None) -> dict[str, Any]:
    """The steps whose host time exceeds their class's median (prefill, decode or mixed) by
    more than ``STALL_S`` (``stalls_by_class``: per class, how many and their host seconds
    beyond its median), and how many of them overlap each cause's windows ((perf_counter
    start, seconds) each: the collector's pauses, the trace writer's work, the recorder's
    Arrow staging, the probe's gaps). ``staged``: which steps follow one of the recorder's
    conversions to Arrow (``staged_steps``), counted as ``stalls_after_staging``.
    A step spans the time from the previous step's end to its own (``wall_time_s`` is a
    step's end on the engine clock, which starts at ``start_time``)."""
    import numpy as np

    host = np.asarray(steps["host_s"], float)
    ends = np.asarray(steps["wall_time_s"], float) + start_time
    begins = np.concatenate([[ends[0] - host[0]], ends[:-1]]) if len(ends) else ends
    prefill = np.asarray(steps["prefill_tokens"]) > 0
    decode = np.asarray(steps["decode_seqs"]) > 0
    stalled = np.zeros(len(host), bool)
    by_class: dict[str, list[float]] = {}
    for name, members in (("prefill", prefill & ~decode), ("decode", decode & ~prefill),
                          ("mixed", prefill & decode)):
        if members.any():
            median = np.median(host[members])
            hit = members & (host > median + STALL_S)
            stalled |= hit
            # Per class: the stalls and their host time beyond the class's median, which every
            # request queued behind one of them waits.
            by_class[name] = [int(hit.sum()), round(float((host[hit] - median).sum()), 4)]
    # The recorder's conversions of events to Arrow, each charged to the next step's host time.
    staged = (np.asarray(staged, bool) if staged is not None
              else np.zeros(len(host), bool))
    out: dict[str, Any] = {"steps": len(host), "stalls": int(stalled.sum()),
                           "stall_host_s": round(float(host[stalled].sum()), 4),
                           "stalls_after_staging": int((stalled & staged).sum()),
                           "steps_after_staging": int(staged.sum()),
                           "stalls_by_class": by_class}
    explained = np.zeros(len(host), bool)
    for name, windows in causes.items():
        hit = np.zeros(len(host), bool)
        for begin, seconds in windows:
            hit |= (begins < begin + seconds) & (ends > begin)
        out[f"stalls_with_{name}"] = int((stalled & hit).sum())
        explained |= hit
    out["stalls_unexplained"] = int((stalled & ~explained).sum())
    return out


def _steal_s() -> float:
    """The hypervisor's steal time over every CPU so far (/proc/stat), in seconds."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _involuntary_switches() -> int:
    """The calling thread's involuntary context switches so far (-1 where not on Linux)."""
    try:
        for line in Path("/proc/thread-self/status").read_text().splitlines():
            if line.startswith("nonvoluntary_ctxt_switches"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


class MethodWindows:
    """The calls of ``cls.name`` (on any thread) as (perf_counter start, seconds), while the
    ``with`` block runs (the method is wrapped on entry and put back on exit)."""

    def __init__(self, cls: type, name: str) -> None:
        self.windows: list[tuple[float, float]] = []
        self._cls, self._name = cls, name
        self._original = getattr(cls, name)

    def __enter__(self) -> MethodWindows:
        windows, original = self.windows, self._original

        def timed(obj: Any, *args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return original(obj, *args, **kwargs)
            finally:
                windows.append((began, time.perf_counter() - began))

        setattr(self._cls, self._name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self._cls, self._name, self._original)


def one_engine(model: str, requests: list[Any], meter: PauseMeter, freeze: bool,
               trace_dir: str | None, probe: bool = False,
               variant: str = "default") -> dict[str, Any]:
    """Start an engine, run ``requests`` and report its collector pauses; with ``trace_dir``,
    also its host stalls and their causes (with ``probe``, the machine's own gaps too).
    ``variant`` (``VARIANTS``): ``deferred`` keeps every event in memory until the run ends (no
    Arrow staging, no segment writes while it runs: the engine without its recorder's work, still
    measured); ``unflushed`` stages as usual but writes nothing until the end; ``process`` writes
    segments from a child process; ``switch`` runs with the thread switch interval at
    ``FAST_SWITCH_S``."""
    switch_was = sys.getswitchinterval()
    if variant == "switch":
        sys.setswitchinterval(FAST_SWITCH_S)
    try:
        return _one_engine(model, requests, meter, freeze, trace_dir, probe, variant)
    finally:
        sys.setswitchinterval(switch_was)


def _one_engine(model: str, requests: list[Any], meter: PauseMeter, freeze: bool,
                trace_dir: str | None, probe: bool, variant: str) -> dict[str, Any]:
    import pyarrow as pa

    from benchmarks.host_probe import HostProbe
    from engine import LLM
    from replay.cli.live import run_workload
    from tracing.recorder import ParquetRecorder
    from tracing.segment_process import ProcessSegmentWriter
    from tracing.segment_writer import SegmentWriter

    meter.take()
    never = 2**31 - 1
    recorder_settings: dict[str, Any] = {
        "deferred": {"trace_flush_steps": never, "trace_flush_seconds": 1e9,
                     "wrap_sink": lambda sink: _deferring(sink, never)},
        "unflushed": {"trace_flush_steps": never, "trace_flush_seconds": 1e9},
        "process": {"trace_segment_writer": "process"},
    }.get(variant, {})
    llm = LLM(model, trace_dir=trace_dir, record_events=trace_dir is not None,
              freeze_gc_heap=freeze, **recorder_settings)
    start = meter.take()
    meter.pauses.clear()
    # The trace writer's segment writes (its own thread) and the recorder's conversion of a few
    # steps' events to Arrow (the engine's thread, charged to the next step's host time).
    writes, stages = MethodWindows(SegmentWriter, "write"), MethodWindows(ParquetRecorder, "_stage")
    # A writer process's segments leave through a file the engine's thread writes (``handoff``).
    handoffs = MethodWindows(ProcessSegmentWriter, "submit")
    with tempfile.TemporaryDirectory() as work, writes, stages, handoffs:
        host_probe = HostProbe(Path(work) / "probe.json")
        steal, switches = _steal_s(), _involuntary_switches()
        began = time.perf_counter()
        with host_probe if probe else contextlib.nullcontext():
            run_workload(llm, requests, use_tqdm=False)
        run_s = time.perf_counter() - began
        steal, switches = _steal_s() - steal, _involuntary_switches() - switches
    during = meter.take()
    header = llm.core.header
    frozen = gc.get_freeze_count()
    start_time = llm.core.start_time
    llm.close()
    row = {"freeze": freeze, "variant": variant, "switch_interval_s": sys.getswitchinterval(),
           "arrow_pool": pa.default_memory_pool().backend_name, **eager_calibration(header),
           "start_gc_s": start["gc_s"],
           "start_gc_counts": start["gc_counts"], "run_s": round(run_s, 3),
           "run_gc_s": during["gc_s"], "run_gc_max_s": during["gc_max_s"],
           "run_gc_counts": during["gc_counts"], "frozen_objects": frozen,
           "tracked_objects": len(gc.get_objects()), "steal_s": round(steal, 3),
           "involuntary_switches": switches}
    if trace_dir is not None:
        from replay.metrics import compute
        from replay.recorded import from_trace
        from tracing.reader import read_trace

        events = from_trace(read_trace(trace_dir))
        steps = events.tables["model_step"]
        # What the stalls do to the latencies a what-if predicts.
        summary = compute(events).summary
        for name in ("ttft_mean_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
            row[name.removesuffix("_s") + "_ms"] = round(summary[name] * 1e3, 2)
        causes = {"gc": [(b, s) for b, s, _ in meter.pauses], "writer": writes.windows,
                  "stage": [w for w in stages.windows if w[1] >= LOGGED_PAUSE_S],
                  "handoff": [w for w in handoffs.windows if w[1] >= LOGGED_PAUSE_S]}
        if probe:
            causes["machine"] = host_probe.gaps
            row["machine_gaps"] = len(host_probe.gaps)
            row["machine_gap_s"] = round(sum(s for _, s in host_probe.gaps), 4)
        row.update(host_stalls(steps, start_time, causes))
        for name, windows in (("stage", stages.windows), ("writer", writes.windows),
                              ("handoff", handoffs.windows)):
            seconds = [s for _, s in windows]
            row[f"{name}_calls"] = len(seconds)
            row[f"{name}_max_ms"] = round(max(seconds, default=0.0) * 1e3, 2)
            row[f"{name}_over_stall"] = sum(s > STALL_S for s in seconds)
    meter.pauses.clear()
    return row


def _deferring(sink: Any, stage_events: int) -> Any:
    """``sink`` (the engine's recorder) converting events only when it flushes."""
    if sink is not None:
        sink.stage_events = stage_events
    return sink


def staged_steps(events: Any) -> Any:
    """Which of a recording's steps (``events``, a ``RecordedEvents``) follow one of the
    recorder's conversions of events to Arrow: the recorder's rule (``stage_due``) replayed
    over the events each step buffered; a segment's flush converts what is left too, which the
    trace does not record, so flushes are not marked."""
    import numpy as np

    from tracing.recorder import stage_due

    steps = np.asarray(events.tables["model_step"]["step"], np.int64)
    if not len(steps):
        return np.zeros(0, bool)
    per_step = np.zeros(int(steps.max()) + 2, np.int64)
    for table in events.tables.values():
        if "step" in table and len(table["step"]):
            at = np.clip(np.asarray(table["step"], np.int64), 0, len(per_step) - 1)
            np.add.at(per_step, at, 1)
    after = np.zeros(len(per_step), bool)
    pending = 0
    for step in range(len(per_step) - 1):
        pending += int(per_step[step])
        if stage_due(pending):
            after[step + 1], pending = True, 0
    return after[steps]


def print_trace_stalls(traces: list[Path]) -> int:
    """Print each recording's host stalls (``host_stalls`` without causes) as a JSON line."""
    from replay.recorded import from_trace
    from tracing.errors import TraceError
    from tracing.reader import read_trace

    for trace in traces:
        try:
            events = from_trace(read_trace(trace))
        except TraceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        stalls = host_stalls(events.tables["model_step"], 0.0, {}, staged_steps(events))
        print(json.dumps({"trace": str(trace), **stalls}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gc_pauses",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--traces", type=Path, nargs="+",
                        help="only count the host stalls of these recordings (no engine runs)")
    parser.add_argument("--engines", type=int, default=4, help="recordings per variant")
    parser.add_argument("--unfrozen", action="store_true",
                        help="first as many engines with freeze_gc_heap off")
    parser.add_argument("--requests", type=int, default=None, help="the workload's first N")
    parser.add_argument("--workload", type=Path, help="a workload file (default: the reference)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--probe", action="store_true",
                        help="run benchmarks.host_probe beside each recording (its own CPU)")
    parser.add_argument("--variants", default="default",
                        help=f"comma-separated, interleaved, of {', '.join(VARIANTS)}")
    parser.add_argument("--warm-ups", type=int, default=3,
                        help="untraced warm-up engines first (the matrix runs three)")
    args = parser.parse_args(argv)
    if args.traces:
        return print_trace_stalls(args.traces)
    if args.model is None:
        parser.error("--model is required (or --traces)")
    from replay.workloads.builtin import reference_workload
    from replay.workloads.store import read_workload

    workload = (list(read_workload(args.workload)) if args.workload is not None
                else reference_workload())
    requests = workload[: args.requests]
    meter = PauseMeter()
    gc.callbacks.append(meter)
    variants = args.variants.split(",")
    if not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: each of {', '.join(VARIANTS)}, got {args.variants!r}")
    rows = []
    for i in range(args.warm_ups):  # the matrix's untraced warm-up engines
        rows.append({"warm_up": i, **one_engine(args.model, reference_workload()[:64], meter,
                                                True, None)})
        print(json.dumps(rows[-1]), flush=True)
    with tempfile.TemporaryDirectory() as work:
        for freeze in (False, True) if args.unfrozen else (True,):
            for i in range(args.engines):
                for variant in variants:
                    trace = f"{work}/{'frozen' if freeze else 'plain'}-{variant}-{i}"
                    rows.append(one_engine(args.model, requests, meter, freeze, trace,
                                           args.probe, variant))
                    print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
