"""What ``replayllm tune`` prints and writes: the Pareto table, the best ``--set`` lines, the
evaluations as Parquet and the Pareto plot (PNG)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from replay.whatif.report import NOT_AVAILABLE, table_cell
from replay.whatif.tune import MIN_SUBSET, Evaluation, Slo, TuneResult


def _row(e: Evaluation, result: TuneResult, front: set[int]) -> dict[str, Any]:
    m = e.result.metrics
    row: dict[str, Any] = {
        "configuration": e.name or "as recorded",
        "status": e.result.status,
        "requests": e.requests,
        "meets_slos": e.meets,
        "rejected": e.result.newly_rejected,
        "goodput_req_s": e.goodput_req_s,
        "throughput_req_s": e.throughput_req_s,
        "throughput_tok_s": m.get("throughput_tok_s", math.nan),
        "pareto": id(e) in front,
    }
    for slo in result.slos:
        row[slo.key] = m.get(slo.key, math.nan)
    return row


def rows(result: TuneResult) -> list[dict[str, Any]]:
    """One row per configuration run on the whole workload, the source's first."""
    front = {id(e) for e in result.pareto_front()}
    return [_row(e, result, front) for e in [result.baseline, *result.evaluations]]


def table(result: TuneResult, only_front: bool = True) -> str:
    """The Pareto front (or every evaluation) and the source's run, as aligned text."""
    body = rows(result)
    if only_front:
        body = [body[0], *(r for r in body[1:] if r["pareto"])]
    headers = ["configuration", "meets", "goodput req/s", "req/s", "tok/s",
               *(f"{s.metric} ms" for s in result.slos)]
    cells = []
    for r in body:
        if r["status"] != "ok":
            cells.append([r["configuration"], r["status"], "", "", "",
                          *("" for _ in result.slos)])
            continue
        meets = "yes" if r["meets_slos"] else f"rejects {r['rejected']}" if r["rejected"] else "no"
        cells.append([r["configuration"], meets,
                      rate(r["goodput_req_s"]), rate(r["throughput_req_s"]),
                      table_cell(r["throughput_tok_s"], "{:.0f}"),
                      *(table_cell(r[s.key], "{:.2f}", 1e3) for s in result.slos)])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths)))

    return "\n".join([line(headers), *(line(c) for c in cells)])


def rate(value: float) -> str:
    """A rate in requests/s: two decimals, or three significant digits below 0.01 (a workload
    spread over hours served 1e-05 req/s, which printed as 0.00 for every configuration,
    the best's goodput too); ``n/a`` where there is none."""
    if not math.isfinite(value):
        return NOT_AVAILABLE
    return f"{value:.3g}" if 0 < abs(value) < 0.01 else f"{value:.2f}"


def describe_search(result: TuneResult) -> str:
    rungs = ", ".join(f"{c} on {n} requests" for n, c in result.rungs)
    method = "full grid" if len(result.rungs) == 1 else "successive halving"
    text = f"searched {result.considered} configurations ({method}: {rungs})"
    whole = result.rungs[-1][1] if result.rungs else 0
    if whole > result.budget:  # never in silence: the workload is too small to narrow on
        text += (f"; all {whole} on the whole workload, over --budget {result.budget}: "
                 f"{result.rungs[-1][0]} requests are too few for a subset of {MIN_SUBSET} or more")
    return text


def verdict(result: TuneResult) -> list[str]:
    """Why nothing meets the SLOs: the run that misses them by the least, and by how much."""
    near = result.closest
    if near is None:
        return []
    misses = [_miss(s, near.result.metrics.get(s.key, math.nan)) for s in result.slos
              if s.ratio(near.result.metrics) > 1]
    if near.result.newly_rejected:
        misses.insert(0, f"rejects {near.result.newly_rejected} of {near.requests} requests")
    return [f"closest: {near.name or 'as recorded'} misses {', '.join(misses)}"]


def _miss(slo: Slo, value: float) -> str:
    """How a run misses ``slo``: its value, or that it has none (every request rejected, or
    a TPOT where every request made one token: it printed ``nan ms > 500 ms``)."""
    if not math.isfinite(value):
        return f"{slo.metric} has no value (no request served has one)"
    return f"{slo.metric} {value * 1e3:.2f} ms > {slo.limit_s * 1e3:g} ms"


def write_pareto_plot(result: TuneResult, path: str | Path) -> Path:
    """Throughput against the first SLO's metric for every run; the front joined, the SLO drawn."""
    from replay.whatif.plots import _pyplot

    plt = _pyplot()
    slo = result.slos[0]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ok = [e for e in result.evaluations if e.result.ok]
    for meets, colour, label in ((True, "tab:green", "meets every SLO"),
                                 (False, "tab:grey", "misses an SLO")):
        chosen = [e for e in ok if e.meets == meets]
        ax.scatter([e.throughput_req_s for e in chosen],
                   [e.result.metrics.get(slo.key, math.nan) for e in chosen],
                   c=colour, s=18, label=label)
    front = result.pareto_front()
    ax.plot([e.throughput_req_s for e in front],
            [e.result.metrics.get(slo.key, math.nan) for e in front],
            "o-", c="tab:red", mfc="none", label="Pareto front")
    if result.baseline.result.ok:
        ax.scatter([result.baseline.throughput_req_s],
                   [result.baseline.result.metrics.get(slo.key, math.nan)],
                   marker="*", s=160, c="tab:blue", label="as recorded", zorder=3)
    best = result.best
    if best is not None:
        ax.scatter([best.throughput_req_s], [best.result.metrics.get(slo.key, math.nan)],
                   marker="D", s=60, c="black", label="best", zorder=3)
    ax.axhline(slo.limit_s, ls="--", c="tab:orange", label=str(slo))
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel(f"{slo.metric} (s)")
    ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.1, right=0.98, top=0.95, bottom=0.12)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def write_outputs(result: TuneResult, out_dir: str | Path) -> list[Path]:
    """tune.parquet (every configuration run on the whole workload)."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tune.parquet"
    pd.DataFrame(rows(result)).to_parquet(path, index=False)
    return [path]
