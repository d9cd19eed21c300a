"""What one ``replayllm whatif`` run writes: its table rows, the ``--out`` directory (Parquet
files, the step-time model, plots) and the ``--report`` page. The same for a plain what-if, a
grid, ``--compare`` and ``--stream``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import SimResult


def row(label: str, source: str, result: Any, status: str = "ok", **extra: Any) -> dict:
    """A table row: a run's label, where it comes from, its status and metrics (and, if any,
    its steps and requests)."""
    return {
        "label": label,
        "source": source,
        "status": status,
        "metrics": dict(result.summary) if result is not None else {},
        "steps": getattr(result, "steps", None),
        "requests": getattr(result, "requests", None),
        **extra,
    }


def sim_row(result: SimResult, source: str = "predicted") -> dict:
    """A simulated variant's row, with its overrides and notes."""
    return row(result.name, source, result if result.ok else None, result.status,
               overrides=result.overrides, notes=result.notes)


def plotter(args: argparse.Namespace) -> Any:
    """The plot worker (None with ``--no-plots``): the caller closes it."""
    if args.no_plots:
        return None
    from replay.whatif.plots import PlotWorker

    return PlotWorker()


def finish(args: argparse.Namespace, rows: list[dict], cost: CostModel | None,
           plots: Any, extra: dict | None = None, lines: list[str] | None = None) -> None:
    """Write the outputs into a fresh directory renamed to ``--out`` once all are written
    (``tracing.outdir.staged_dir``): an earlier whatif's files never stay beside them, and a
    full disk leaves nothing half-written. ``plots``: ``plotter(args)``'s worker, or None;
    ``lines``: what the run printed besides the variants table (``--compare``'s table and
    verdict), shown above it in the ``--report`` page."""
    from replay.whatif.report import write_outputs
    from tracing.outdir import WHATIF, staged_dir

    notes = []
    with staged_dir(args.out, WHATIF, "whatif", force=True) as stage:
        written = write_outputs(stage, rows, extra)
        if cost is not None:
            cost.save(stage / "cost_model.json")
            written.append(stage / "cost_model.json")
        if plots is not None:
            from replay.whatif.plots import PlotRun, PlotsUnavailable

            # A loadgen client's row has figures only: no steps or requests to draw.
            runs = [PlotRun(r["label"], r["metrics"], r["steps"], r["requests"])
                    for r in rows if r["status"] == "ok" and "steps" in r]
            try:
                written += plots.write(stage, runs)
            except PlotsUnavailable as exc:
                notes.append(f"plots skipped: {exc}")
    for note in notes:
        print(note)
    print(f"wrote {', '.join(p.name for p in written)} to {args.out}")
    if getattr(args, "report", None):
        _write_report(args, rows, extra, written, lines or [])


def _write_report(args: argparse.Namespace, rows: list[dict], extra: dict | None,
                  written: list[Path], lines: list[str]) -> None:
    import pandas as pd

    from replay.whatif.html_report import write_report
    from replay.whatif.report import variants_table
    from tracing.outfile import write_via_temporary

    tables = [("summary", pd.read_parquet(Path(args.out) / "summary.parquet"))]
    tables += [(name, frame) for name, frame in (extra or {}).items()]
    # The files were written in the staging directory, since renamed to --out.
    pngs = [Path(args.out) / p.name for p in written if p.suffix == ".png"]
    page = write_via_temporary(args.report, lambda tmp: write_report(
        tmp, "replayllm whatif", [*lines, variants_table(rows)], tables, pngs))
    print(f"wrote {page}")
