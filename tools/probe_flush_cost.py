"""What the recorder's segment flushes cost the engine: one cell's workload recorded by fresh
engines at several ``trace_flush_steps``, interleaved (and untraced), after the matrix driver's
warm-up engines. Prints, per recording, the wall time, the mean decode step interval, and the
median gap after a flush beyond the step's device time against the other steps'
(``flush_gaps``). The traces stay under OUT for the CPU's metrics (``benchmarks.matrix spread``).

    python tools/probe_flush_cost.py MODEL_DIR MATRIX_DIR OUT [--cells chat-default ...]
        [--flush 64 256] [--repeat 2] [--untraced]

A GPU tool (docs/gpu-notes.md, session 19).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def flush_gaps(trace: Path, flush_steps: int) -> dict[str, Any]:
    """From a recording's ``model_step`` rows: the wall time between the previous step's end and
    this one's beyond this step's own device time (``duration_s``), its median at the decode
    steps after a flush (``step % flush_steps == 0``) and at the other decode steps, and the
    mean decode interval, in ms."""
    from tracing import read_trace

    ms = read_trace(str(trace)).df("model_step")
    steps = ms["step"].to_numpy()
    end = ms["wall_time_s"].to_numpy()
    gap = np.diff(end) - ms["duration_s"].to_numpy()[1:]
    after = steps[1:] % flush_steps == 0
    decode = ms["kind"].to_numpy()[1:] == "decode"
    flushed = after & decode
    return {
        "steps": int(len(steps)),
        "flush_gap_ms": round(float(np.median(gap[flushed])) * 1e3, 3) if flushed.any() else None,
        "other_gap_ms": round(float(np.median(gap[~after & decode])) * 1e3, 3),
        "decode_interval_ms": round(float(np.mean(np.diff(end)[decode])) * 1e3, 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("matrix_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--cells", nargs="+", default=["chat-default"])
    parser.add_argument("--flush", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--untraced", action="store_true", help="also a run without a trace")
    args = parser.parse_args()
    from benchmarks.matrix import CELLS, _requests, warm_up_engines
    from engine import LLM
    from replay.cli.live import run_workload

    warm_up_engines(args.model)
    variants: list[int | None] = list(args.flush) + ([None] if args.untraced else [])
    results = []
    for cell, rep, flush in [(c, r, f) for c in args.cells for r in range(1, args.repeat + 1)
                             for f in variants]:
        family, overrides = CELLS[cell]
        requests = _requests(args.matrix_dir, family)
        name = f"{cell}-f{flush or 'off'}-r{rep}"
        trace = args.out / name
        kwargs: dict[str, Any] = dict(overrides)
        if flush is None:
            kwargs["record_events"] = False
        else:
            kwargs.update(trace_dir=str(trace), trace_flush_steps=flush)
        llm = LLM(str(args.model), **kwargs)
        began = time.perf_counter()
        run_workload(llm, requests, use_tqdm=False)
        wall = time.perf_counter() - began
        summary = llm.close()
        row: dict[str, Any] = {"name": name, "flush_steps": flush, "wall_s": round(wall, 4),
                               "steps": summary.get("steps"),
                               "tokens": summary.get("completion_tokens")}
        if flush is not None:
            row.update(flush_gaps(trace, flush))
            row["recorder"] = json.loads((trace / "summary.json").read_text())["recorder"]
        print(json.dumps(row), flush=True)
        results.append(row)
    (args.out / "flush_cost.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
