"""What ``replayllm whatif`` prints and writes: the variants table, the --compare table, and the
Parquet / PNG files of a run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from replay.metrics import COMPARED, relative_error

# Terminal table columns: metric, header, format, scale to display units.
TABLE_COLUMNS: tuple[tuple[str, str, str, float], ...] = (
    ("steps", "steps", "{:.0f}", 1.0),
    ("throughput_tok_s", "tok/s", "{:.0f}", 1.0),
    ("makespan_s", "makespan s", "{:.2f}", 1.0),
    ("ttft_mean_s", "TTFT mean ms", "{:.0f}", 1e3),
    ("ttft_p99_s", "TTFT p99 ms", "{:.0f}", 1e3),
    ("tpot_p50_s", "TPOT p50 ms", "{:.2f}", 1e3),
    ("tpot_p99_s", "TPOT p99 ms", "{:.2f}", 1e3),
    ("e2e_p50_s", "e2e p50 s", "{:.2f}", 1.0),
    ("queue_p50_s", "queue p50 s", "{:.2f}", 1.0),
    ("preemptions", "preempt", "{:.0f}", 1.0),
    ("prefix_hit_rate", "hit %", "{:.1f}", 100.0),
    ("batch_size_mean", "batch", "{:.1f}", 1.0),
    ("kv_usage_max", "KV max %", "{:.0f}", 100.0),
)
NOT_AVAILABLE = "n/a"


def table_cell(value: float | None, fmt: str, scale: float = 1.0) -> str:
    """``value * scale`` in ``fmt``, or ``n/a`` where a run has no such value (None, NaN: a
    TPOT where every request made one token; the metrics give NaN, never an infinity)."""
    if value is None or not math.isfinite(value):
        return NOT_AVAILABLE
    return fmt.format(value * scale)


def variants_table(rows: list[dict[str, Any]]) -> str:
    """One line per run (``label``, ``status``, ``metrics``); a run that cannot run says why."""
    headers = ["variant", *(h for _, h, _, _ in TABLE_COLUMNS)]
    body: list[list[str] | str] = []
    for row in rows:
        if row["status"] != "ok":
            body.append(f"{row['label']}  {row['status']}")
            continue
        metrics = row["metrics"]
        body.append(
            [row["label"], *(table_cell(metrics.get(k), f, s) for k, _, f, s in TABLE_COLUMNS)]
        )
    cells = [b for b in body if isinstance(b, list)]
    widths = [max([len(headers[i]), *(len(c[i]) for c in cells)]) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                       for i, (h, w) in enumerate(zip(headers, widths)))]
    for b in body:
        if isinstance(b, str):
            lines.append(b)
        else:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(b, widths))))
    return "\n".join(lines)


def comparison_rows(predicted: dict[str, float], measured: dict[str, float]) -> list[dict]:
    """Per metric: predicted, measured, relative error (NaN where either is unknown)."""
    out = []
    for metric, _ in COMPARED:
        p, m = predicted.get(metric, math.nan), measured.get(metric, math.nan)
        error = relative_error(p, m) if not (math.isnan(p) or math.isnan(m)) else math.nan
        out.append({"metric": metric, "predicted": p, "measured": m, "rel_error": error})
    return out


def comparison_table(rows: list[dict[str, Any]]) -> str:
    fmt = dict(COMPARED)
    width = max(len(r["metric"]) for r in rows)
    lines = [f"{'metric':<{width}}  {'predicted':>12}  {'measured':>12}  {'error':>8}"]
    for r in rows:
        f = fmt[r["metric"]]
        error = r["rel_error"]
        shown = NOT_AVAILABLE if math.isnan(error) else f"{100 * error:+.2f}%"
        lines.append(
            f"{r['metric']:<{width}}  {table_cell(r['predicted'], f):>12}  "
            f"{table_cell(r['measured'], f):>12}  {shown:>8}"
        )
    return "\n".join(lines)


def _tagged(frames: list[tuple[str, pd.DataFrame | None]]) -> pd.DataFrame:
    parts = [frame.assign(variant=label) for label, frame in frames if frame is not None]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def write_outputs(out_dir: str | Path, rows: list[dict[str, Any]],
                  extra: dict[str, pd.DataFrame] | None = None) -> list[Path]:
    """summary.parquet (one row per run), steps.parquet and requests.parquet (tagged by
    ``variant``), plus any ``extra`` tables; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = pd.DataFrame(
        [
            {
                "variant": r["label"],
                "source": r["source"],
                "status": r["status"],
                "overrides": json.dumps(r.get("overrides", {}), default=str),
                "notes": "; ".join(r.get("notes", [])),
                **r["metrics"],
            }
            for r in rows
        ]
    )
    tables = {
        "summary": summary,
        "steps": _tagged([(r["label"], r.get("steps")) for r in rows]),
        "requests": _tagged([(r["label"], r.get("requests")) for r in rows]),
        **(extra or {}),
    }
    written = []
    for name, frame in tables.items():
        path = out / f"{name}.parquet"
        frame.to_parquet(path, index=False)
        written.append(path)
    return written
