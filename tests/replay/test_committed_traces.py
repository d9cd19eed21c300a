"""Every trace committed under traces/ still replays identically with today's scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.verify import verify
from tracing.reader import read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
COMMITTED = sorted(p for p in TRACES.iterdir() if (p / "run.json").exists())


def test_the_expected_traces_are_committed() -> None:
    """The CPU sample and the two H200 ground-truth traces are present (not silently skipped)."""
    names = {p.name for p in COMMITTED}
    assert {"cpu-tiny-demo", "h200-reference", "h200-constrained"} <= names


@pytest.mark.parametrize("trace_dir", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_trace_verifies(trace_dir: Path) -> None:
    """Replaying the trace reproduces every recorded decision, and the trace is complete."""
    trace = read_trace(trace_dir)
    assert trace.complete
    result = verify(trace_dir)
    assert result.identical, result.report()
    assert result.num_events == trace.num_events


def test_the_reference_decides_the_same_under_todays_deferral_rule() -> None:
    """traces/h200-reference was recorded before ``defer_block_rule`` existed (its header replays
    with "per_running"). Its pool never ran short, so today's default ("needed") makes exactly
    its decisions, overlapped flags included: it stands for a run of today's engine."""
    from replay.decisions import compare_decisions
    from replay.recorded import from_trace
    from replay.replayer import replay

    recorded = from_trace(read_trace(TRACES / "h200-reference"))
    assert "defer_block_rule" not in recorded.header["config"]
    run = replay(recorded, defer_block_rule="needed")
    assert compare_decisions(recorded, run.replayed) is None
