"""benchmarks/gc_pauses.py: the collector's pauses are summed per generation (the longest
kept), and the calibration's eager probe steps are read from a trace header."""

from __future__ import annotations

import gc

from benchmarks.gc_pauses import PauseMeter, eager_calibration


def test_the_meter_sums_each_generations_pauses_and_resets() -> None:
    meter = PauseMeter()
    gc.callbacks.append(meter)
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        gc.callbacks.remove(meter)
    taken = meter.take()
    assert taken["gc_counts"][0] >= 1 and taken["gc_counts"][2] >= 1
    assert all(s >= 0 for s in taken["gc_s"]) and taken["gc_s"][2] > 0
    assert 0 < taken["gc_max_s"][2] <= taken["gc_s"][2]  # the longest of the full passes
    assert meter.take() == {"gc_s": [0.0, 0.0, 0.0], "gc_max_s": [0.0, 0.0, 0.0],
                            "gc_counts": [0, 0, 0]}


def test_the_eager_probe_steps_come_from_the_calibration() -> None:
    def row(kind: str, graph: bool, prefill: int, decode: int, seconds: float) -> dict:
        return {"kind": kind, "graph_used": graph, "prefill_tokens": prefill,
                "decode_seqs": decode, "duration_s": seconds}

    header = {"calibration": [
        row("prefill", True, 1, 0, 0.001), row("prefill", False, 1, 0, 0.0105),
        row("prefill", False, 16, 0, 0.02), row("decode", False, 0, 64, 0.0116),
        row("decode", True, 0, 64, 0.0018)]}
    assert eager_calibration(header) == {"eager_prefill_1_ms": 10.5, "eager_decode_64_ms": 11.6}
    assert eager_calibration({}) == {}
