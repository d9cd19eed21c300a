"""Do garbage-collector passes stall the first steps of a run (H200)?

A reference run's mean TTFT is set by its first ~9 prefill steps, so one 20 ms host stall there
moves it by ~5%. This runs the reference workload (default config, a Parquet trace) several
times in one process, alternating the engine's start-up objects frozen (``LLM`` freezes them;
the default) and unfrozen (``gc.unfreeze()`` after start-up), and prints per run: the objects
the collector tracks and those frozen, each collection of 1 ms or more (generation, ms), the
host seconds of the prefill steps, the mean TTFT and the throughput.

Usage (a CUDA GPU): ``python tools/probe_gc.py MODEL_DIR OUT_DIR [RUNS_PER_MODE]``.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPORT_PAUSE_S = 1e-3


def run(model: str, frozen: bool, work: Path) -> dict[str, Any]:
    from engine import LLM
    from replay.metrics import compute
    from replay.recorded import from_trace
    from replay.workloads import reference_workload
    from tracing.reader import read_trace

    requests = reference_workload()
    trace = Path(tempfile.mkdtemp(dir=work))
    llm = LLM(model, trace_dir=str(trace / "t"))
    if not frozen:
        gc.unfreeze()
    tracked, frozen_count = len(gc.get_objects()), gc.get_freeze_count()
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def on_collect(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif (elapsed := time.perf_counter() - started[0]) >= REPORT_PAUSE_S:
            pauses.append((info["generation"], round(1e3 * elapsed, 2)))

    from engine import SamplingParams

    params = [SamplingParams(temperature=r.temperature, max_tokens=r.max_tokens,
                             ignore_eos=r.ignore_eos) for r in requests]
    gc.callbacks.append(on_collect)
    began = time.perf_counter()
    llm.generate([r.prompt for r in requests], params, use_tqdm=False)
    wall = time.perf_counter() - began
    gc.callbacks.remove(on_collect)
    llm.close()
    events = from_trace(read_trace(trace / "t"))
    ms = events.tables["model_step"]
    prefill_host = [round(1e3 * h, 1) for k, h in zip(ms["kind"], ms["host_s"]) if k == "prefill"]
    summary = compute(events).summary
    return {
        "frozen": frozen,
        "tracked_objects": tracked,  # what a full collection walks
        "frozen_objects": frozen_count,
        "pauses_ms": pauses,
        "prefill_host_ms": prefill_host,
        "ttft_mean_s": round(summary["ttft_mean_s"], 4),
        "tok_s": round(sum(r.max_tokens for r in requests) / wall),
    }


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory() as work:
        run(model, True, Path(work))  # warm-up: the process's first run pays compilation
        for _ in range(runs):
            for frozen in (False, True):
                result = run(model, frozen, Path(work))
                print(json.dumps(result), flush=True)
                results.append(result)
    (out / "probe_gc.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
