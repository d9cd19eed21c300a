"""Where a GPU step's host time goes, per workload, decode rows and prefill tokens (issue 16).

The what-if prices a light-load decode's host work at what the reference workload's steps
show, and light-load recordings spend less (docs/BENCHMARKS.md 7z): 0.55-0.85 ms a few-row step
against ~1.0 ms in a reference run's tail at the same rows and context. This runs matrix cells
one engine after another in one process (as ``benchmarks.matrix record`` does, after its
warm-up engines), each recorded as usual, and times every engine-loop iteration's parts by
wrapping the engine's own methods (no engine code changes): the scheduler's decision
(``schedule``), the launch (``launch``: staging the inputs, the graph replay, the logits, the
sampler, the step's token copy and events), the deferred post-processing (``defer``), the wait
for the tokens in flight (``wait``, not host work), the resolve (``resolve``), the recorder
(``sink``) and the collector's pauses (``gc``). ``other`` is the loop's time less all of them;
``add`` is the driver's adds of requests since the previous iteration (outside the loop).

    python tools/probe_host_phases.py MODEL WORKLOAD_DIR OUT_DIR [--cells reference-default,...]
        [--traces DIR] [--requests N] [--warm-ups 1] [--deadline-s 150]

Writes ``OUT_DIR/phases.json`` (per cell, per decode-row bin: the medians of each part and
of the recorded ``host_s``) after each cell, and prints one table per cell.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROW_BINS = (1, 4, 8, 16, 32, 64, 128, 257)
PARTS = ("schedule", "stage", "forward", "logits", "sample", "launched", "launch_rest",
         "defer", "resolve", "sink", "gc", "other", "wait", "add")
# Prefill steps by batched tokens (graph prefills: the long-prompt cells' host, 7ac).
TOKEN_BINS = (1, 2048, 8192, 16385)


class Phases:
    """Per engine-loop iteration, seconds by part; the iteration's launched rows and path."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []  # one list per cell: ``reset``
        self.now: dict[str, Any] = defaultdict(float)
        self._gc_began = 0.0

    def timed(self, part: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.now[part] += time.perf_counter() - began
        return wrapper

    def reset(self) -> None:
        self.rows, self.now = [], defaultdict(float)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.now["gc"] += time.perf_counter() - self._gc_began
            self.now[f"gc{info.get('generation', 0)}"] += 1


def instrument(llm: Any, phases: Phases) -> None:
    """Wrap the engine's methods on this engine's objects (and LaunchedStep's, module-wide)."""
    import engine.runner.launched_step as launched_step

    core, runner = llm.core, llm.runner
    cuda = runner.cuda  # None on a CPU (a smoke run): the launch is timed as a whole
    scheduler = core.scheduler
    scheduler.schedule = phases.timed("schedule", scheduler.schedule)
    scheduler.postprocess_pending = phases.timed("defer", scheduler.postprocess_pending)
    scheduler.resolve = phases.timed("resolve", scheduler.resolve)
    if core.sink is not None:
        core.sink.on_step_end = phases.timed("sink", core.sink.on_step_end)
    if cuda is not None:
        cuda.buffers.stage_sequences = phases.timed("stage", cuda.buffers.stage_sequences)
        cuda._forward_staged = phases.timed("forward", cuda._forward_staged)
        cuda.model.compute_logits = phases.timed("logits", cuda.model.compute_logits)
        cuda.sample = phases.timed("sample", cuda.sample)
    launch = phases.timed("launch", runner.launch)

    def launch_step(batch: Any, previous: Any = None) -> Any:
        if batch.is_decode:
            phases.now["decode_rows"] = len(batch.seqs)
        elif batch.kind == "prefill":
            phases.now["prefill_tokens"] = batch.num_batched_tokens
        return launch(batch, previous)

    runner.launch = launch_step
    if not getattr(launched_step.LaunchedStep, "_probed", False):
        cls = launched_step.LaunchedStep
        cls.__init__ = phases.timed("launched", cls.__init__)
        cls.result = phases.timed("wait", cls.result)
        cls._probed = True
    advance = core._advance_loop
    add_request = phases.timed("add", core.add_request)

    def add(*args: Any, **kwargs: Any) -> Any:
        phases.now["adds"] += 1
        return add_request(*args, **kwargs)

    core.add_request = add

    def loop() -> bool:
        pending = {k: phases.now.get(k, 0.0) for k in ("add", "adds")}  # since the last one
        phases.now = defaultdict(float, pending)
        began = time.perf_counter()
        busy = advance()
        phases.now["loop"] = time.perf_counter() - began
        if phases.now.get("launch"):
            phases.rows.append(dict(phases.now))
        phases.now = defaultdict(float)  # the adds before the next iteration start from 0
        return busy

    core._advance_loop = loop


def summarize(rows: list[dict[str, Any]], host: dict[int, list[float]],
              prefill_host: dict[int, list[float]] | None = None) -> list[dict[str, Any]]:
    """Per decode-row bin, then per prefill-token bin: the iterations' median of each part
    (ms) and the recorded host_s (``prefill_host``: of graph prefills, by batched tokens)."""
    bins = [("decode_rows", lo, hi, f"{lo}-{hi - 1}", host)
            for lo, hi in zip(ROW_BINS, ROW_BINS[1:])]
    bins += [("prefill_tokens", lo, hi, f"prefill {lo}-{hi - 1} tok", prefill_host or {})
             for lo, hi in zip(TOKEN_BINS, TOKEN_BINS[1:])]
    out = []
    for key, lo, hi, label, recorded_by in bins:
        mine = [r for r in rows if lo <= r.get(key, 0) < hi]
        if len(mine) < 5:
            continue
        for r in mine:
            inner = sum(r.get(k, 0.0) for k in ("stage", "forward", "logits", "sample",
                                                 "launched"))
            r["launch_rest"] = r["launch"] - inner
            r["other"] = r["loop"] - sum(r.get(k, 0.0) for k in (
                "schedule", "launch", "defer", "resolve", "sink", "wait"))
        line = {"rows": label, "iterations": len(mine)}
        for part in PARTS:
            line[part] = round(1e3 * float(np.median([r.get(part, 0.0) for r in mine])), 4)
        line["loop_less_wait"] = round(1e3 * float(np.median(
            [r["loop"] - r.get("wait", 0.0) for r in mine])), 4)
        recorded = [h for n in range(lo, hi) for h in recorded_by.get(n, [])]
        line["recorded_host"] = round(1e3 * float(np.median(recorded)), 4) if recorded else None
        line["gc_per_100"] = round(100 * float(np.mean([r.get("gc0", 0) + r.get("gc1", 0)
                                                        + r.get("gc2", 0) for r in mine])), 2)
        line["adds_mean"] = round(float(np.mean([r.get("adds", 0) for r in mine])), 2)
        line["add_mean"] = round(1e3 * float(np.mean([r.get("add", 0.0) for r in mine])), 4)
        out.append(line)
    return out


def save_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Every iteration's parts (seconds) in run order, one float32 array a part: the run's
    course (does a part grow as the run goes on?) is read from these, not from the medians."""
    keys = sorted({k for r in rows for k in r})
    np.savez_compressed(path, **{k: np.array([r.get(k, 0.0) for r in rows], np.float32)
                                 for k in keys})


def recorded_hosts(trace: Path, kind: str = "decode", by: str = "num_seqs"
                   ) -> dict[int, list[float]]:
    """The recorded ``host_s`` of the trace's graph steps of ``kind``, by ``by``."""
    from tracing.reader import read_trace

    steps = read_trace(str(trace)).df("model_step")
    steps = steps[(steps.kind == kind) & steps.graph_used]
    out: dict[int, list[float]] = defaultdict(list)
    for n, h in zip(steps[by].tolist(), steps.host_s.tolist()):
        out[int(n)].append(float(h))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("workloads", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--traces", type=Path, default=Path("/tmp/probe-host-phases"))
    parser.add_argument("--cells", default="reference-default,chat-default,reference-default")
    parser.add_argument("--requests", type=int, default=0, help="the first N of each (0: all)")
    parser.add_argument("--warm-ups", type=int, default=1,
                        help="untraced engines first (benchmarks.matrix's WARMUP, in order)")
    parser.add_argument("--deadline-s", type=float, default=150.0,
                        help="start no further cell after this many seconds")
    args = parser.parse_args(argv)
    from benchmarks.matrix import CELLS, WARMUP, _requests
    from engine import LLM
    from replay.cli.live import run_workload

    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    from replay.workloads.builtin import reference_workload

    for overrides in WARMUP[:args.warm_ups]:  # compile and load before the first recording
        warm = LLM(str(args.model), record_events=False, **overrides)
        run_workload(warm, reference_workload()[:64], use_tqdm=False)
        warm.close()
    print(f"warm-up {time.perf_counter() - began:.1f} s", flush=True)
    results: dict[str, Any] = {}
    phases = Phases()  # one for the process: LaunchedStep's methods are wrapped once
    gc.callbacks.append(phases.on_gc)
    for index, cell in enumerate(args.cells.split(",")):
        if time.perf_counter() - began > args.deadline_s:
            print(f"{cell}: skipped (deadline)", flush=True)
            continue
        family, overrides = CELLS[cell]
        trace = args.traces / f"{index}-{cell}"
        llm = LLM(str(args.model), trace_dir=str(trace), **overrides)
        instrument(llm, phases)
        phases.reset()
        try:
            requests = _requests(args.workloads, family)
            run_workload(llm, requests[:args.requests or len(requests)], use_tqdm=False)
        finally:
            llm.close()
        table = summarize(phases.rows, recorded_hosts(trace),
                          recorded_hosts(trace, "prefill", "prefill_tokens"))
        results[f"{index}-{cell}"] = table
        save_rows(args.out / f"rows-{index}-{cell}.npz", phases.rows)
        (args.out / "phases.json").write_text(json.dumps(results, indent=1))
        print(f"\n{index}-{cell} ({time.perf_counter() - began:.1f} s)")
        print(" | ".join(["rows", "n", *PARTS, "loop-wait", "rec host", "gc/100", "adds",
                          "add ms (mean)"]))
        for line in table:
            print(" | ".join(str(line[k]) for k in ("rows", "iterations", *PARTS,
                                                     "loop_less_wait", "recorded_host",
                                                     "gc_per_100", "adds_mean", "add_mean")),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
