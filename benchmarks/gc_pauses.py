"""Python's garbage collector inside engine runs: how long its pauses take, and what they do to
launch-bound (eager) steps.

An eager step launches every kernel from Python, so its time follows the host; the start-up
calibration (``engine/calibration.py``) times the same eager steps at every engine start, which
makes it a probe of the host's state. This runs several engines one after another in one process,
as ``benchmarks.matrix record`` does (three warm-up engines, then recordings), and reports per
engine: the calibration's eager 1-token prefill and 64-row eager decode, the collector's pauses
(``gc.callbacks``: count and total seconds of each generation, during start-up and during the
run) and the objects it tracks. ``--freeze`` repeats the recordings with the heap collected and
frozen (``gc.collect(); gc.freeze()``) after each engine's start-up.

    python -m benchmarks.gc_pauses --model DIR [--engines 4] [--freeze] [--requests N] [--json FILE]
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
    """Sums the collector's pauses per generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.began = 0.0
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.began = time.perf_counter()
        else:
            generation = info["generation"]
            self.seconds[generation] += time.perf_counter() - self.began
            self.counts[generation] += 1

    def take(self) -> dict[str, Any]:
        out = {"gc_s": [round(s, 4) for s in self.seconds], "gc_counts": list(self.counts)}
        self.seconds, self.counts = [0.0, 0.0, 0.0], [0, 0, 0]
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
    llm = LLM(model, trace_dir=trace_dir) if trace_dir else LLM(model, record_events=False)
    if freeze:
        gc.collect()
        gc.freeze()
    start = meter.take()
    began = time.perf_counter()
    run_workload(llm, requests, use_tqdm=False)
    run_s = time.perf_counter() - began
    during = meter.take()
    header = llm.core.header
    llm.close()
    return {"freeze": freeze, **eager_calibration(header), "start_gc_s": start["gc_s"],
            "start_gc_counts": start["gc_counts"], "run_s": round(run_s, 3),
            "run_gc_s": during["gc_s"], "run_gc_counts": during["gc_counts"],
            "tracked_objects": len(gc.get_objects())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gc_pauses",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--engines", type=int, default=4, help="recordings per variant")
    parser.add_argument("--freeze", action="store_true", help="then as many with gc.freeze()")
    parser.add_argument("--requests", type=int, default=256, help="of the reference workload")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from replay.workloads.builtin import reference_workload

    requests = reference_workload()[: args.requests]
    meter = PauseMeter()
    gc.callbacks.append(meter)
    rows = []
    for i in range(3):  # the matrix's untraced warm-up engines
        rows.append({"warm_up": i, **one_engine(args.model, requests[:64], meter, False, None)})
        print(json.dumps(rows[-1]), flush=True)
    with tempfile.TemporaryDirectory() as work:
        for freeze in (False, True) if args.freeze else (False,):
            for i in range(args.engines):
                trace = f"{work}/{'frozen' if freeze else 'plain'}-{i}"
                rows.append(one_engine(args.model, requests, meter, freeze, trace))
                print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
