"""Why does a small eager prefill take ~25 ms early in a run and ~15 ms later (H200)?

Runs the constrained what-if workload (the reference workload, max_num_seqs=64, 300 KV blocks:
~150 small recompute prefills) several times in one process under different conditions and
prints, per run, the start-up calibration's small-prefill times and the in-run prefill device
times by thirds of the run:

- ``disk``: a Parquet trace (background writer threads), as recorded for traces/;
- ``memory``: events kept in memory (no writer threads);
- ``gc-frozen``: a Parquet trace with the garbage collector frozen after start-up and
  disabled during ``generate``.

Usage (a CUDA GPU): ``python tools/probe_prefill_floor.py MODEL_DIR OUT_DIR``.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
from pathlib import Path

CONSTRAINED = {"max_num_seqs": 64, "num_kvcache_blocks": 300}


def prefill_stats(tables: dict) -> dict:
    ms = tables["model_step"]
    rows = [(s, d, n) for s, k, d, n in zip(ms["step"], ms["kind"], ms["duration_s"],
                                              ms["prefill_tokens"]) if k == "prefill"]
    small = [(s, d) for s, d, n in rows if n < 4096]
    last = max(ms["step"]) if ms["step"] else 1
    thirds = [[d for s, d in small if t * last / 3 <= s < (t + 1) * last / 3] for t in range(3)]
    return {"small_prefills": len(small),
            "median_ms_by_third": [round(1e3 * statistics.median(x), 2) if x else None
                                   for x in thirds]}


def run(model: str, mode: str, work: Path) -> dict:
    from engine import LLM
    from replay.workloads.builtin import reference_workload

    trace = None if mode == "memory" else str(work / mode)
    llm = LLM(model, trace_dir=trace, **CONSTRAINED)
    calibration = [(r["prefill_tokens"], round(1e3 * r["duration_s"], 2))
                   for r in llm.core.header.get("calibration", []) if r["kind"] == "prefill"]
    requests = reference_workload()
    params = [r.sampling_params() for r in requests]
    if mode == "gc-frozen":
        gc.collect()
        gc.freeze()
        gc.disable()
    try:
        llm.generate([list(r.prompt) for r in requests], params, use_tqdm=False)
    finally:
        gc.enable()
        gc.unfreeze()
    llm.close()
    if trace is None:
        tables = llm.core.sink.tables
    else:
        from tracing.reader import read_trace

        t = read_trace(trace)
        tables = {"model_step": t.columns("model_step")}
        tables["model_step"] = {k: list(v) for k, v in tables["model_step"].items()}
    return {"mode": mode, "calibration_ms": calibration, **prefill_stats(tables)}


def main() -> int:
    model, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())
    results = []
    for mode in ("disk", "memory", "gc-frozen", "disk"):
        results.append(run(model, mode, work / str(len(results))))
        print(json.dumps(results[-1]), flush=True)
    (out / "prefill_floor.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
