"""Per recorded trace, one line of its request metrics (tools/engine_ab.sh): throughput, TTFT
mean/p50/p99, queue p50 and TPOT mean/p50 (``replay.metrics.compute``), so two engines' recordings
compare on the GPU host without bringing the traces back.
Usage: python tools/ab_ttft.py TRACE_DIR..."""
from __future__ import annotations

import sys

from replay.metrics import compute
from replay.recorded import from_trace
from tracing.reader import read_trace


def line(path: str) -> str:
    s = compute(from_trace(read_trace(path))).summary
    ms = {k: s[k] * 1e3 for k in ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "queue_p50_s",
                                   "tpot_mean_s", "tpot_p50_s")}
    return (f"{path} | tok/s {s['throughput_tok_s']:.1f} | ttft mean {ms['ttft_mean_s']:.1f} "
            f"p50 {ms['ttft_p50_s']:.1f} p99 {ms['ttft_p99_s']:.1f} ms | queue p50 "
            f"{ms['queue_p50_s']:.1f} ms | tpot mean {ms['tpot_mean_s']:.3f} "
            f"p50 {ms['tpot_p50_s']:.3f} ms")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(line(arg))
