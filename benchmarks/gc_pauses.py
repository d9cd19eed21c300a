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

    python -m benchmarks.gc_pauses --model DIR [--engines 4] [--unfrozen] [--requests N]
        [--workload FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any


class PauseMeter:
    """Sums the collector's pauses per generation, and keeps the longest (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.began = 0.0
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.began = time.perf_counter()
        else:
            generation = info["generation"]
            pause = time.perf_counter() - self.began
            self.seconds[generation] += pause
            self.longest[generation] = max(self.longest[generation], pause)
            self.counts[generation] += 1

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


def one_engine(model: str, requests: list[Any], meter: PauseMeter, freeze: bool,
               trace_dir: str | None) -> dict[str, Any]:
    from engine import LLM
    from replay.cli.live import run_workload

    meter.take()
    llm = LLM(model, trace_dir=trace_dir, record_events=trace_dir is not None,
              freeze_gc_heap=freeze)
    start = meter.take()
    began = time.perf_counter()
    run_workload(llm, requests, use_tqdm=False)
    run_s = time.perf_counter() - began
    during = meter.take()
    header = llm.core.header
    frozen = gc.get_freeze_count()
    llm.close()
    return {"freeze": freeze, **eager_calibration(header), "start_gc_s": start["gc_s"],
            "start_gc_counts": start["gc_counts"], "run_s": round(run_s, 3),
            "run_gc_s": during["gc_s"], "run_gc_max_s": during["gc_max_s"],
            "run_gc_counts": during["gc_counts"], "frozen_objects": frozen,
            "tracked_objects": len(gc.get_objects())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gc_pauses",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--engines", type=int, default=4, help="recordings per variant")
    parser.add_argument("--unfrozen", action="store_true",
                        help="first as many engines with freeze_gc_heap off")
    parser.add_argument("--requests", type=int, default=None, help="the workload's first N")
    parser.add_argument("--workload", type=Path, help="a workload file (default: the reference)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from replay.workloads.builtin import reference_workload
    from replay.workloads.store import read_workload

    workload = (list(read_workload(args.workload)) if args.workload is not None
                else reference_workload())
    requests = workload[: args.requests]
    meter = PauseMeter()
    gc.callbacks.append(meter)
    rows = []
    for i in range(3):  # the matrix's untraced warm-up engines
        rows.append({"warm_up": i, **one_engine(args.model, reference_workload()[:64], meter,
                                                True, None)})
        print(json.dumps(rows[-1]), flush=True)
    with tempfile.TemporaryDirectory() as work:
        for freeze in (False, True) if args.unfrozen else (True,):
            for i in range(args.engines):
                trace = f"{work}/{'frozen' if freeze else 'plain'}-{i}"
                rows.append(one_engine(args.model, requests, meter, freeze, trace))
                print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
