"""PNG plots of what-if runs (matplotlib, Agg backend; optional: ``pip install replayllm[plots]``).

Each plot takes ``PlotRun``s: a label, the summary metrics and the per-step and per-request
frames of ``replay.metrics``, the same for a recording and a prediction, so a plot shows them
side by side. ``PlotWorker`` draws in a forked process that imports matplotlib while the
simulation still runs (the import alone costs as much as simulating one variant).
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.errors import ReplayLLMError

if TYPE_CHECKING:
    import pandas as pd

DPI = 100
FIGURE_SIZE = (9.0, 4.5)
# Fixed margins: matplotlib's tight_layout costs more than the drawing itself.
MARGINS = {"left": 0.08, "right": 0.98, "top": 0.95, "bottom": 0.12}
PANEL_SPACE = 0.3
GROUP_WIDTH = 0.8  # of the unit space each metric's group of bars takes
TAB20 = 20  # colours in matplotlib's tab20 map
LEGEND_ROWS = 6
# Bars of the side-by-side figure: metric, title.
BARS = (
    ("throughput_tok_s", "throughput"),
    ("makespan_s", "makespan"),
    ("ttft_mean_s", "mean TTFT"),
    ("tpot_p50_s", "p50 TPOT"),
    ("e2e_p99_s", "p99 end-to-end"),
    ("preemptions", "preemptions"),
)
LATENCY_PANELS = (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "end-to-end (s)"))


class PlotsUnavailable(ReplayLLMError):
    """matplotlib is not installed."""


@dataclass
class PlotRun:
    """One run to draw: its label, summary metrics, per-step and per-request frames."""

    label: str
    summary: dict[str, float]
    steps: pd.DataFrame
    requests: pd.DataFrame


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable(
            "plots need matplotlib: pip install 'replayllm[plots]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _x(steps: Any) -> tuple[np.ndarray, str]:
    time_s = steps["time_s"].to_numpy(dtype=float)
    if len(time_s) and np.isfinite(time_s).all():
        return time_s, "time (s)"
    return steps["step"].to_numpy(), "step"


def _over_time(plt: Any, runs: list[PlotRun], column: str, ylabel: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    xlabel = "step"
    for run in runs:
        x, xlabel = _x(run.steps)
        ax.step(x, run.steps[column].to_numpy(), where="post", label=run.label, linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.subplots_adjust(**MARGINS)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _latency_cdfs(plt: Any, runs: list[PlotRun], path: Path) -> bool:
    fig, axes = plt.subplots(1, len(LATENCY_PANELS), figsize=(FIGURE_SIZE[0] * 1.4, 4.0))
    drawn = False
    for ax, (column, title) in zip(axes, LATENCY_PANELS):
        for run in runs:
            values = np.sort(run.requests[column].to_numpy(dtype=float))
            values = values[np.isfinite(values)]
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=run.label)
                drawn = True
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    if drawn:
        axes[0].legend(fontsize="small")
        fig.subplots_adjust(wspace=PANEL_SPACE, **MARGINS)
        fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return drawn


def _side_by_side(plt: Any, runs: list[PlotRun], path: Path) -> None:
    """Grouped bars in one panel: per metric, each run relative to the first run (or, where
    the first run's value is 0, to the largest). One panel: matplotlib's cost is per axes."""
    fig, ax = plt.subplots(figsize=(FIGURE_SIZE[0] * 1.3, FIGURE_SIZE[1]))
    width = GROUP_WIDTH / len(runs)
    titles = []
    for group, (metric, title) in enumerate(BARS):
        values = np.array([run.summary.get(metric, np.nan) for run in runs], dtype=float)
        reference = values[0] if values[0] else np.nanmax(np.append(values, 0.0))
        relative = values / reference if reference else np.zeros_like(values)
        offsets = group + (np.arange(len(runs)) - (len(runs) - 1) / 2) * width
        for i, (x, y) in enumerate(zip(offsets, np.nan_to_num(relative))):
            colour = plt.cm.tab20(i % TAB20)
            ax.bar(x, y, width, color=colour, label=runs[i].label if not group else None)
        titles.append(title if values[0] else f"{title}\n(vs largest)")
    ax.set_xticks(np.arange(len(BARS)))
    ax.set_xticklabels(titles, fontsize="small")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"relative to {runs[0].label}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="x-small", ncol=max(1, len(runs) // LEGEND_ROWS), loc="upper left")
    fig.subplots_adjust(left=0.07, right=0.98, top=0.95, bottom=0.14)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write_plots(out_dir: str | Path, runs: list[PlotRun]) -> list[Path]:
    """Write kv_blocks.png, batch_size.png, latency_cdf.png (if times are known) and
    variants.png into ``out_dir``; return the paths written."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if not runs:
        return written
    path = out / "kv_blocks.png"
    _over_time(plt, runs, "kv_blocks_used", "KV blocks in use", path)
    written.append(path)
    path = out / "batch_size.png"
    _over_time(plt, runs, "num_seqs", "sequences in the batch", path)
    written.append(path)
    path = out / "latency_cdf.png"
    if _latency_cdfs(plt, runs, path):
        written.append(path)
    path = out / "variants.png"
    _side_by_side(plt, runs, path)
    written.append(path)
    return written


def _warm_up() -> None:
    _pyplot()


class PlotWorker:
    """Draws plots in a forked process started now, so importing matplotlib overlaps the
    simulation (on another core). Falls back to drawing in this process where fork is missing.
    """

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        if "fork" in multiprocessing.get_all_start_methods():
            from replay.whatif.worker_signals import ignore_sigint

            # Ctrl-C is the parent's: close() waits for a drawing worker, never cut mid-send.
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"),
                                             initializer=ignore_sigint)
            self._pool.submit(_warm_up)

    def write(self, out_dir: str | Path, runs: list[PlotRun]) -> list[Path]:
        """``write_plots`` in the worker; raises ``PlotsUnavailable`` without matplotlib."""
        if self._pool is None:
            return write_plots(out_dir, runs)
        try:
            return self._pool.submit(write_plots, out_dir, runs).result()
        finally:
            self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
