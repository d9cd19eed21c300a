"""Where a what-if error comes from: a recording's steps beside their prediction, step by step.

A cell of the validation matrix misses TPOT by 6%: is it the decode steps' device time, their
host work, how the two overlap, or the prefills that interrupt the decodes? This predicts the
recording from a source (as ``benchmarks.matrix fidelity`` does) and sets recorded against
predicted per step class and, for decode steps, per bin of rows: how many steps, their median
interval (the wall time each step added: from the previous step's end, or from the arrival it
waited for, to its own end, as the cost model reads a recording) and mean interval (a tail of
stalled steps moves a cell's TPOT and not the median), device time and host work,
and each class's share of the run's busy wall time.

    python -m benchmarks.step_errors TARGET --source SOURCE [--profile PROFILE] [--json OUT]

The figures are the recording's and the simulation's own steps, matched by class and bin, not
one by one (where arrivals make decisions timing-dependent the two runs' steps differ).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

# Decode steps are binned by rows: the fixed cost of a step changes with its CUDA graph's size.
ROW_BINS = (1, 4, 8, 16, 32, 64, 128, 257, 1 << 20)


def step_table(events: Any) -> dict[str, np.ndarray]:
    """Each step of ``events`` (a ``RecordedEvents``): its class name (``decode_graph``,
    ``prefill``, ...), decode rows, interval (``features.step_intervals``: idle waits for
    arrivals left out), device time and host work."""
    from replay.whatif.cost.features import step_intervals

    model_step = events.tables["model_step"]
    kind = np.asarray(model_step["kind"]).astype(str)
    graph = np.asarray(model_step["graph_used"], dtype=bool)
    host = (np.asarray(model_step["host_s"], dtype=float) if "host_s" in model_step
            else np.full(len(kind), np.nan))
    return {"class": np.array([f"{k}_graph" if g else k for k, g in zip(kind, graph)]),
            "rows": np.asarray(model_step["num_seqs"], dtype=np.int64),
            "interval": step_intervals(events),
            "device": np.asarray(model_step["duration_s"], dtype=float),
            "host": host}


def _groups(table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Masks of each step class, decode classes split by ``ROW_BINS``."""
    out: dict[str, np.ndarray] = {}
    for name in sorted(set(table["class"].tolist())):
        mine = table["class"] == name
        if not name.startswith("decode"):
            out[name] = mine
            continue
        for lo, hi in zip(ROW_BINS, ROW_BINS[1:]):
            binned = mine & (table["rows"] >= lo) & (table["rows"] < hi)
            if binned.any():
                out[f"{name} {lo}-{hi - 1} rows"] = binned
    return out


def _summary(table: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, float]:
    def median(values: np.ndarray) -> float:
        values = values[np.isfinite(values)]
        return float(np.median(values)) if len(values) else float("nan")

    busy = np.nansum(table["interval"])
    return {"steps": int(mask.sum()),
            "interval_ms": 1e3 * median(table["interval"][mask]),
            # The mean too: a tail of stalled steps moves TPOT, not the median.
            "interval_mean_ms": 1e3 * float(np.nanmean(table["interval"][mask]))
            if mask.any() else float("nan"),
            "device_ms": 1e3 * median(table["device"][mask]),
            "host_ms": 1e3 * median(table["host"][mask]),
            "wall_share": float(np.nansum(table["interval"][mask]) / busy) if busy else 0.0}


def compare(recorded: Any, predicted: Any) -> list[dict[str, Any]]:
    """One row per step class (decode classes per bin of rows) of either run (``RecordedEvents``
    each): the recorded and predicted ``_summary`` (None where that run has no such step)."""
    ours, theirs = step_table(recorded), step_table(predicted)
    mine, other = _groups(ours), _groups(theirs)
    rows = []
    for name in sorted(set(mine) | set(other), key=_order):
        rows.append({"steps": name,
                     "recorded": _summary(ours, mine[name]) if name in mine else None,
                     "predicted": _summary(theirs, other[name]) if name in other else None})
    return rows


def _order(name: str) -> tuple[str, int]:
    """Classes by name, a decode class's bins by their lowest row count."""
    base, _, rest = name.partition(" ")
    return base, int(rest.split("-")[0]) if rest else 0


def predict(target: str, source: str, profile: str | None,
            options: list[str] | None = None) -> tuple[Any, Any]:
    """The target's events and its prediction's from ``source`` (and ``profile``) under the
    target's own workload, arrivals and Config; ``options``: ``CostOptions`` items
    (``name=value``)."""
    from replay.recorded import from_trace
    from replay.whatif.cost.model import CostModel
    from replay.whatif.cost.options import CostOptions
    from replay.whatif.simulate import cold_start_of, load_source, run_variant
    from tracing.reader import read_trace

    model = CostModel.fit(from_trace(read_trace(source)), source=source, profile=profile,
                          options=CostOptions.parse(options or []))
    events = from_trace(read_trace(target))
    result = run_variant(load_source(events), {}, model, Path(target).name,
                         cold_start=cold_start_of(events.header))
    if not result.ok or result.events is None:
        raise SystemExit(f"{target}: cannot be predicted ({result.status})")
    return events, result.events


def markdown(rows: list[dict[str, Any]]) -> str:
    """The comparison as a table: recorded / predicted per column, and the predicted median
    interval's error."""
    lines = ["| steps | count | interval ms | error | mean interval ms | error | device ms | "
             "host ms | share of wall |", "|---|---|---|---|---|---|---|---|---|"]

    def pair(row: dict[str, Any], key: str, fmt: str) -> str:
        a, b = row["recorded"], row["predicted"]
        return " / ".join("-" if s is None else format(s[key], fmt) for s in (a, b))

    for row in rows:
        a, b = row["recorded"], row["predicted"]
        def error(key: str, a: Any = a, b: Any = b) -> str:
            return ("" if a is None or b is None or not a[key]
                    else f"{b[key] / a[key] - 1:+.1%}")

        lines.append(f"| {row['steps']} | {pair(row, 'steps', 'd')} | "
                     f"{pair(row, 'interval_ms', '.3f')} | {error('interval_ms')} | "
                     f"{pair(row, 'interval_mean_ms', '.3f')} | {error('interval_mean_ms')} | "
                     f"{pair(row, 'device_ms', '.3f')} | {pair(row, 'host_ms', '.3f')} | "
                     f"{pair(row, 'wall_share', '.1%')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_errors",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a recording with measured step times")
    parser.add_argument("--source", required=True, help="the timing source's recording")
    parser.add_argument("--profile", help="a device profile (replayllm profile)")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--cost-option", action="append", default=[], metavar="NAME=VALUE",
                        help="replay.whatif.cost.options.CostOptions (repeatable)")
    args = parser.parse_args(argv)
    from engine.errors import ReplayLLMError

    try:
        recorded, predicted = predict(args.target, args.source, args.profile,
                                      args.cost_option)
    except ReplayLLMError as exc:
        raise SystemExit(f"error: {exc}") from None
    rows = compare(recorded, predicted)
    print(f"{args.target} (recorded / predicted from {args.source})")
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
