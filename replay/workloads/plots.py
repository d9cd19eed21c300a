"""PNG plots of a workload summary (matplotlib, Agg; optional: ``pip install replayllm[plots]``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.errors import ReplayLLMError
from replay.workloads.describe import WorkloadSummary
from tracing.outfile import write_via_temporary

DPI = 100
FIGURE_SIZE = (12.0, 3.6)
HISTOGRAM_BINS = 50
RATE_BINS = 60


def plot_summary(summary: WorkloadSummary, path: str | Path, title: str = "") -> Path:
    """One PNG: first-turn arrivals per second over time, prompt and output length histograms."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReplayLLMError("plots need matplotlib: pip install 'replayllm[plots]'") from None
    figure, axes = plt.subplots(1, 3, figsize=FIGURE_SIZE, dpi=DPI)
    rate, prompt, output = axes
    if len(summary.arrivals) and summary.span_s > 0:
        counts, edges = np.histogram(summary.arrivals, bins=RATE_BINS)
        rate.step(edges[:-1], counts / (edges[1] - edges[0]), where="post")
    rate.set(title="arrivals", xlabel="time (s)", ylabel="requests / s")
    for axis, values, name in ((prompt, summary.prompt_lens, "prompt"),
                               (output, summary.output_lens, "output")):
        if len(values):
            axis.hist(values, bins=HISTOGRAM_BINS)
        axis.set(title=f"{name} length", xlabel="tokens", ylabel="requests")
    if title:
        figure.suptitle(title)
    figure.subplots_adjust(left=0.06, right=0.98, bottom=0.16, top=0.84, wspace=0.3)
    out = Path(path)
    try:  # a failure (a full disk) leaves no partial plot and an earlier one whole
        write_via_temporary(out, lambda tmp: figure.savefig(tmp, format=out.suffix[1:].lower()))
    finally:
        plt.close(figure)
    return out
