"""benchmarks/recorded_decodes.py: a recording's decode steps are read with their contexts,
chosen across shapes, and timed again through the runner built from the trace's own config."""

from __future__ import annotations

from pathlib import Path

from benchmarks.recorded_decodes import choose, decode_batches, summary, time_recorded

DEMO = Path(__file__).resolve().parents[2] / "traces" / "cpu-tiny-demo"


def test_every_decode_step_is_read_with_its_rows_contexts() -> None:
    """The committed CPU demo has 63 decode steps (its run summary); each batch names its
    step, recorded device time and one context per decode row, in step order."""
    batches = decode_batches(DEMO)
    assert len(batches) == 63
    assert [b["step"] for b in batches] == sorted(b["step"] for b in batches)
    assert all(b["recorded_s"] > 0 and b["contexts"] and min(b["contexts"]) > 0
               for b in batches)


def test_steps_are_chosen_across_row_and_context_bins() -> None:
    """Many short small batches and a few long wide ones: the long wide ones are chosen too,
    not crowded out, and never more than asked."""
    many = [{"step": i, "recorded_s": 1e-3, "contexts": [100, 200]} for i in range(100)]
    few = [{"step": 100 + i, "recorded_s": 5e-3, "contexts": [9000] + [500] * 40}
           for i in range(3)]
    chosen = choose(many + few, 6)
    assert len(chosen) == 6
    assert sum(1 for b in chosen if b["step"] >= 100) == 3
    assert [b["step"] for b in chosen] == sorted(b["step"] for b in chosen)


def test_recorded_batches_are_timed_through_the_runner() -> None:
    """On the CPU with the tiny model: each timed row has a positive device time, and the
    summary has one line per bin after its header."""
    rows, too_big = time_recorded(DEMO, None, 6, 1)
    assert rows and len(rows) + too_big <= 6
    assert all(r["timed_s"] > 0 and r["recorded_s"] > 0 for r in rows)
    lines = summary(rows)
    assert lines[0].split()[:2] == ["rows", "longest"] and len(lines) >= 2
