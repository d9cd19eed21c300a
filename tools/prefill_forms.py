"""Which form of the prefill attention's cost prices CUDA-graph prefills (issue 16, BENCHMARKS 7l).

Fits ``device = a + b * padded_tokens + attention`` on a device profile's graph-prefill rows
alone (least mean relative error: a grid over the attention slopes, least squares for a and b),
for four forms of ``attention``, then prices the recorded graph prefills of the cells named and
prints each cell's summed device-time error:

- F0 ``max(c * work, d * longest)``: today's roofline (``prefill_attn_work`` = new x context);
- F1 ``max(c * causal, d * longest)``: work counted as the causal mask computes it
  (``work - sum(new^2) / 2``);
- F2 ``c * causal + d * longest``;
- F3 ``max(c * causal, d * longest * waves)``: waves of 132 programs (64-row query tiles, 8 KV
  heads).

    python tools/prefill_forms.py PROFILE[,PROFILE...] TRACE [TRACE...]

A study, not the cost model: it reads no source trace and knows nothing of host time.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd

from replay.recorded import from_trace
from replay.whatif.cost.decode_attention import longest_contexts, prompt_squares
from replay.whatif.cost.linear import causal_work
from tracing.reader import read_trace

FORMS = ("F0", "F1", "F2", "F3")
SLOTS, TILE_ROWS, KV_HEADS = 132, 64, 8


def profile_rows(paths: list[str]) -> pd.DataFrame:
    """A profile's graph-prefill rows (prompts of one length over equal cached shares)."""
    out = []
    for path in paths:
        with open(path) as f:
            rows = json.load(f)["rows"]
        for row in rows:
            if row["kind"] != "prefill" or not row.get("graph_used"):
                continue
            seqs, tokens = row["num_seqs"], row["prefill_tokens"]
            new = tokens / seqs
            out.append({"padded": row["padded_tokens"], "work": row["prefill_attn_work"],
                        "squares": seqs * new * new,
                        "longest": new + (row.get("cached_tokens") or 0) / seqs,
                        "programs": seqs * np.ceil(new / TILE_ROWS) * KV_HEADS,
                        "device": row["duration_s"]})
    return pd.DataFrame(out)


def trace_rows(path: str) -> pd.DataFrame:
    """A recording's graph prefills with the same columns, from its scheduled rows (squares and
    longest contexts as the cost model reads them)."""
    events = from_trace(read_trace(path))
    steps = pd.DataFrame({k: np.asarray(events.tables["model_step"][k]) for k in (
        "step", "kind", "graph_used", "padded_tokens", "prefill_attn_work", "duration_s")})
    steps["squares"] = prompt_squares(events)
    steps["longest"] = longest_contexts(events, decode=False)
    steps = steps[(steps.kind == "prefill") & steps.graph_used]
    rows = pd.DataFrame({k: np.asarray(events.tables["seq_scheduled"][k])
                         for k in ("step", "num_new_tokens")})
    rows = rows[rows.num_new_tokens != 1]
    programs = (np.ceil(rows.num_new_tokens / TILE_ROWS) * KV_HEADS).groupby(rows.step).sum()
    steps = steps.join(programs.rename("programs"), on="step")
    return pd.DataFrame({"padded": steps.padded_tokens, "work": steps.prefill_attn_work,
                         "squares": steps.squares, "longest": steps.longest,
                         "programs": steps.programs, "device": steps.duration_s})


def attention(rows: pd.DataFrame, form: str, c: float, d: float) -> np.ndarray:
    causal = causal_work(rows.work, rows.squares)
    if form == "F0":
        return np.maximum(c * rows.work, d * rows.longest)
    if form == "F1":
        return np.maximum(c * causal, d * rows.longest)
    if form == "F2":
        return c * causal + d * rows.longest
    return np.maximum(c * causal, d * rows.longest * np.ceil(rows.programs / SLOTS))


def fit(rows: pd.DataFrame, form: str) -> tuple[float, float, float, float, float]:
    """(mean relative error, a, b, c, d) of the best fit over the slope grid."""
    best = None
    y = rows.device.to_numpy()
    weights = np.c_[np.ones(len(rows)), rows.padded] / y[:, None]
    for d in np.linspace(0, 2e-6, 201):
        for c in np.linspace(0, 1.2e-9, 121):
            rest = y - attention(rows, form, c, d)
            a, b = np.linalg.lstsq(weights, rest / y, rcond=None)[0]
            error = float(np.mean(np.abs(a + b * rows.padded + attention(rows, form, c, d) - y)
                                  / y))
            if best is None or error < best[0]:
                best = (error, a, b, c, d)
    return best  # type: ignore[return-value]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-3].strip(), file=sys.stderr)
        return 2
    profile = profile_rows(argv[0].split(","))
    cells = {path.rstrip("/"): trace_rows(path) for path in argv[1:]}
    for form in FORMS:
        error, a, b, c, d = fit(profile, form)
        parts = [f"{form}: profile MAPE {100 * error:.1f}% (a {1e3 * a:.3f} ms, b "
                 f"{1e6 * b:.3f} us/token, c {1e9 * c:.3f} ns, d {1e6 * d:.3f} us/key)"]
        for path, rows in cells.items():
            priced = a + b * rows.padded + attention(rows, form, c, d)
            error = priced.sum() / rows.device.sum() - 1
            parts.append(f"{path.split('/')[-1]} {100 * error:+.1f}%")
        print(" | ".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
