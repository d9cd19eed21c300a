"""What one ``replayllm whatif`` run writes: its table rows, the ``--out`` directory (Parquet
files, the step-time model, plots) and the ``--report`` page. The same for a plain what-if, a
grid, ``--compare`` and ``--stream``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import SimResult

if TYPE_CHECKING:
    import pandas as pd


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
    report: ReportInputs | None = None
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
        if getattr(args, "report", None):
            # Read now, from this command's own staging directory: once renamed to --out, the
            # directory is the next writer's to replace (two whatifs into one --out take turns
            # under a lock), and a page read from there could show that command's results.
            report = read_report_inputs(written)
    for note in notes:
        print(note)
    print(f"wrote {', '.join(p.name for p in written)} to {args.out}")
    if report is not None:
        _write_report(args, rows, extra, report, lines or [])


@dataclass(frozen=True)
class ReportInputs:
    """What a ``--report`` page shows of the files a run wrote, held in memory."""

    summary: pd.DataFrame  # summary.parquet as written (and as a reader of it gets it)
    pngs: dict[str, bytes]  # each plot's file name and bytes, in the order written


def read_report_inputs(written: list[Path]) -> ReportInputs:
    """``written``'s summary table and plots, read back before they are put in place."""
    import pandas as pd

    summary = next(p for p in written if p.name == "summary.parquet")
    return ReportInputs(pd.read_parquet(summary), read_plots(written))


def read_plots(written: list[Path]) -> dict[str, bytes]:
    """The PNG plots among ``written`` (name -> bytes, in order), read from the staging
    directory before it is renamed to ``--out``: from then on the directory is the next
    writer's to replace, and a page embedding it could show that command's plots. For
    ``write_page``; ``tune`` too."""
    return {p.name: p.read_bytes() for p in written if p.suffix == ".png"}


def write_page(report: str | Path, title: str, lines: list[str],
               tables: list[tuple[str, pd.DataFrame]], pngs: dict[str, bytes]) -> Path:
    """The ``--report`` page of ``tables`` and the plots ``read_plots`` held, written whole or
    not at all (a temporary sibling renamed to ``report``)."""
    from replay.whatif.html_report import write_report
    from tracing.outfile import write_via_temporary

    return write_via_temporary(report, lambda tmp: write_report(tmp, title, lines, tables, pngs))


def _write_report(args: argparse.Namespace, rows: list[dict], extra: dict | None,
                  inputs: ReportInputs, lines: list[str]) -> None:
    from replay.whatif.report import variants_table

    tables = [("summary", inputs.summary)]
    tables += [(name, frame) for name, frame in (extra or {}).items()]
    page = write_page(args.report, "replayllm whatif", [*lines, variants_table(rows)], tables,
                      inputs.pngs)
    print(f"wrote {page}")
