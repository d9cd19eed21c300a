"""Where a recording's few-row decodes lose their interval: steps whose host work outruns the
median by 60% or more, and how many of them fall at ``step % 8 == 0``, the steps that paid the
recorder's conversion of the last 8 steps' events to Arrow before session 36 (it is charged to
the next step's host time; ``tracing.recorder.STAGE_EVENTS`` replaced the 8-step cadence).

    python tools/stage_tail.py TRACE [TRACE ...] [--max-rows 3]

Prints per recording: the graph decodes of at most ``--max-rows`` rows, their median and mean
interval (``benchmarks.step_errors.step_table``), their median host and device time, the slow-host
steps (host > 1.6 x the median), the share of those at ``step % 8 == 0``, and the share of the
interval beyond the median those steps carry. A CPU tool over committed recordings
(docs/gpu-notes.md, session 36).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SLOW_HOST = 1.6  # a step's host time over the median host by this factor: a slow-host step
OLD_STAGE_STEPS = 8  # the recorder's cadence before session 36


def stage_tail(trace: str, max_rows: int) -> dict[str, Any]:
    """The few-row decode tail of one recording (see the module's docstring)."""
    from benchmarks.step_errors import step_table
    from replay.recorded import from_trace
    from tracing.reader import read_trace

    events = from_trace(read_trace(trace))
    table = step_table(events)
    steps = np.asarray(events.tables["model_step"]["step"], np.int64)
    few = ((table["class"] == "decode_graph") & (table["rows"] <= max_rows)
           & np.isfinite(table["interval"]) & np.isfinite(table["host"]))
    if not few.any():
        return {"trace": trace, "steps": 0}
    interval, host = table["interval"][few], table["host"][few]
    slow = host > SLOW_HOST * np.median(host)
    at_stage = steps[few] % OLD_STAGE_STEPS == 0
    excess = np.clip(interval - np.median(interval), 0.0, None)
    return {"trace": trace, "steps": int(few.sum()),
            "interval_median_ms": round(1e3 * float(np.median(interval)), 3),
            "interval_mean_ms": round(1e3 * float(interval.mean()), 3),
            "host_median_ms": round(1e3 * float(np.median(host)), 3),
            "device_median_ms": round(1e3 * float(np.median(table["device"][few])), 3),
            "slow_host_steps": int(slow.sum()),
            "slow_at_step_mod_8": int((slow & at_stage).sum()),
            "excess_share_of_slow": round(float(excess[slow].sum() / excess.sum()), 3)
            if excess.sum() > 0 else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--max-rows", type=int, default=3)
    args = parser.parse_args(argv)
    print("| recording | steps | interval median / mean ms | host / device median ms | "
          "slow-host steps | at step % 8 | their share of the excess |")
    print("|---|---|---|---|---|---|---|")
    for trace in args.traces:
        row = stage_tail(trace, args.max_rows)
        if not row["steps"]:
            print(f"| {trace} | 0 | | | | | |")
            continue
        print(f"| {trace} | {row['steps']} | {row['interval_median_ms']} / "
              f"{row['interval_mean_ms']} | {row['host_median_ms']} / {row['device_median_ms']} | "
              f"{row['slow_host_steps']} | {row['slow_at_step_mod_8']} | "
              f"{row['excess_share_of_slow']:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
