"""Median host work and device time of each trace's graph decodes, per decode-row bin.

    python tools/decode_host_stats.py TRACE [TRACE ...]

One line per trace: ``rows: n host dev`` (ms) for 1-3, 4-7, ..., 128-256 rows. Used by
``tools/engine_ab.sh`` to set two engines' recordings side by side on one host.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROW_BINS = ((1, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 257))


def line(path: str) -> str:
    """The trace's per-bin medians as one line (or why it could not be read)."""
    from tracing.errors import TraceError
    from tracing.reader import read_trace

    try:
        steps = read_trace(path).df("model_step")
    except (TraceError, OSError) as exc:
        return f"{path}: unreadable ({exc})"
    decodes = steps[(steps.kind == "decode") & steps.graph_used]
    parts = []
    for lo, hi in ROW_BINS:
        rows = decodes[(decodes.num_seqs >= lo) & (decodes.num_seqs < hi)]
        if len(rows):
            parts.append(f"{lo}-{hi - 1}: n={len(rows)} host={1e3 * rows.host_s.median():.3f} "
                         f"dev={1e3 * rows.duration_s.median():.3f}")
    return f"{path} | " + " | ".join(parts)


if __name__ == "__main__":
    for trace in sys.argv[1:]:
        print(line(trace), flush=True)
