"""Every trace committed under traces/ still replays identically with today's scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.verify import verify
from tracing.reader import read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
# The top-level traces and the validation matrix's recordings (traces/matrix/, the same cells
# from two later device calls, traces/matrix-call9/ and traces/matrix-call9b/, and two calls on
# session 13's engine, traces/matrix-s13/ and traces/matrix-s13b/).
COMMITTED = sorted(p.parent for p in TRACES.glob("*/run.json")) + sorted(
    p.parent for p in TRACES.glob("matrix*/*/run.json"))


def test_the_expected_traces_are_committed() -> None:
    """The CPU sample and the two H200 ground-truth traces are present (not silently skipped)."""
    names = {p.name for p in COMMITTED}
    assert {"cpu-tiny-demo", "h200-reference", "h200-constrained"} <= names
    assert sum(p.parent.name == "matrix" for p in COMMITTED) >= 12
    assert sum(p.parent.name == "matrix-call9" for p in COMMITTED) == 13
    assert sum(p.parent.name == "matrix-call9b" for p in COMMITTED) == 13
    assert sum(p.parent.name == "matrix-s13" for p in COMMITTED) == 4
    assert sum(p.parent.name == "matrix-s13b" for p in COMMITTED) == 6


@pytest.mark.parametrize("trace_dir", COMMITTED,
                         ids=[f"{p.parent.name}/{p.name}" for p in COMMITTED])
def test_committed_trace_verifies(trace_dir: Path) -> None:
    """Replaying the trace reproduces every recorded decision, and the trace is complete."""
    trace = read_trace(trace_dir)
    assert trace.complete
    result = verify(trace_dir)
    assert result.identical, result.report()
    assert result.num_events == trace.num_events


@pytest.mark.parametrize("name", ["h200-reference", "h200-constrained"])
def test_the_h200_ground_truth_was_recorded_warm_by_todays_engine(name: str) -> None:
    """The two H200 traces the simulator's time fidelity is measured on were both recorded after
    a warm-up run in their process (no one-off compilation in either: like with like), under
    today's default deferral rule and with the start-up calibration's eager rows."""
    from engine.config import Config

    header = read_trace(TRACES / name).header
    assert header["engine_starts_before"] >= 1
    assert header["config"]["defer_block_rule"] == Config().defer_block_rule
    eager = {row["prefill_tokens"] for row in header["calibration"]
             if row["kind"] == "prefill" and not row["graph_used"]}
    assert {1, 16, 128, 512, 2048} <= eager
