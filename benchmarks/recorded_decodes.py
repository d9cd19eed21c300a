"""A recording's own decode steps timed again through the model runner, as the device profile
times its grid (``engine.calibration.time_batch``): each chosen step's decode contexts as one
synthetic batch over fresh consecutive blocks, its device time beside the recorded one. Tells
whether a shape the what-if misprices (docs/BENCHMARKS.md 7q: a long row among few) runs as
recorded when timed alone (then the profile's grid lacks it) or faster (then the live run's
surroundings cost it).

    python -m benchmarks.recorded_decodes TRACE [--model DIR] [--steps 48] [--repeats 5]
        [--json OUT.json]

On the CPU it runs the tiny model (the tests); its figures mean something on the GPU only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

# Steps chosen per bin of (decode rows, longest context): the bins cover few and many rows,
# short and long rows, so a handful of each shape is timed within a device call.
ROW_BINS = (0, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTEXT_BINS = (0, 1024, 2048, 4096, 8192, 1 << 30)


def decode_batches(trace: str | Path) -> list[dict[str, Any]]:
    """Each decode step of ``trace`` (every row computing one token): its step, recorded device
    time and decode rows' contexts, in step order."""
    from tracing.reader import read_trace

    t = read_trace(str(trace))
    steps = t.df("model_step")
    rows = t.df("seq_scheduled")
    contexts = rows.groupby("step")["context_len"].apply(list)
    new = rows.groupby("step")["num_new_tokens"].max()
    out = []
    for step, kind, duration in zip(steps["step"], steps["kind"], steps["duration_s"]):
        if kind != "decode" or step not in contexts.index or new[step] != 1:
            continue
        out.append({"step": int(step), "recorded_s": float(duration),
                    "contexts": [int(c) for c in contexts[step]]})
    return out


def choose(batches: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """About ``count`` batches spread over the (rows, longest context) bins: round-robin over
    the bins that have steps, each bin's steps taken evenly through the run."""
    bins: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for batch in batches:
        key = (int(np.digitize(len(batch["contexts"]), ROW_BINS)),
               int(np.digitize(max(batch["contexts"]), CONTEXT_BINS)))
        bins.setdefault(key, []).append(batch)
    queues = [members[:: max(1, len(members) // max(1, count // len(bins)))]
              for _, members in sorted(bins.items())]
    chosen: list[dict[str, Any]] = []
    while len(chosen) < count and any(queues):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return sorted(chosen, key=lambda b: b["step"])


def time_recorded(trace: str | Path, model: str | None, count: int, repeats: int
                  ) -> tuple[list[dict[str, Any]], int]:
    """Time ``count`` of the trace's decode batches (``choose``) through a runner built with the
    trace's own config (its model replaced by ``model`` where given); also how many chosen
    batches were left out for needing more blocks than the runner's pool holds."""
    from engine.calibration import time_batch
    from engine.model.checkpoint import default_model_dir
    from engine.profiling import ProfilePoint
    from engine.runner.model_runner import ModelRunner
    from replay.replayer import config_from_header
    from tracing.reader import read_trace

    header = read_trace(str(trace)).header
    config = config_from_header(header, model=str(model or default_model_dir()),
                                calibration_repeats=0)
    runner = ModelRunner(config)
    try:
        block_size = config.kvcache_block_size
        capacity = runner.num_kvcache_blocks
        rows, too_big = [], 0
        for batch in choose(decode_batches(trace), count):
            point = ProfilePoint("decode", 0, tuple(batch["contexts"]))
            if point.blocks(block_size) > capacity:
                too_big += 1
                continue
            timed = time_batch(runner, point.batch(block_size), repeats)
            rows.append({**{k: batch[k] for k in ("step", "recorded_s")},
                         "rows": len(batch["contexts"]), "longest": max(batch["contexts"]),
                         "kv_tokens": sum(batch["contexts"]), "timed_s": timed["duration_s"],
                         "graph_used": timed["graph_used"]})
    finally:
        runner.close()
    return rows, too_big


def _bin(edges: tuple[int, ...], value: int) -> str:
    """``value``'s bin of ``edges`` as ``lo-hi`` (the last bin open: ``lo+``)."""
    i = int(np.digitize(value, edges))
    return f"{edges[i - 1]}-{edges[i]}" if i < len(edges) else f"{edges[-1]}+"


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Lines: per (decode rows, longest context) bin, how many steps and the median of their
    recorded over timed device time."""
    bins: dict[tuple[int, int], list[float]] = {}
    labels: dict[tuple[int, int], str] = {}
    for row in rows:
        key = (int(np.digitize(row["rows"], ROW_BINS)),
               int(np.digitize(row["longest"], CONTEXT_BINS)))
        labels[key] = f"{_bin(ROW_BINS, row['rows']):>9} {_bin(CONTEXT_BINS, row['longest']):>11}"
        bins.setdefault(key, []).append(row["recorded_s"] / max(row["timed_s"], 1e-9))
    lines = ["     rows     longest  steps  recorded / timed (median)"]
    for key, ratios in sorted(bins.items()):
        lines.append(f"{labels[key]}  {len(ratios):>5}  {statistics.median(ratios):.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recorded_decodes",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--model", default=None, help="checkpoint directory (default: tiny)")
    parser.add_argument("--steps", type=int, default=48, help="decode steps to time")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    rows, too_big = time_recorded(args.trace, args.model, args.steps, args.repeats)
    print("\n".join(summary(rows)))
    if too_big:
        print(f"{too_big} chosen steps left out: more blocks than the runner's pool holds")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
