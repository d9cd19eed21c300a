"""Every trace committed under traces/ still replays identically with today's scheduler."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replay.verify import verify
from tracing.reader import read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
# The top-level traces and the validation matrix's recordings (traces/matrix/, the same cells
# from two later device calls, traces/matrix-call9/ and traces/matrix-call9b/, two calls on
# session 13's engine, traces/matrix-s13/ and traces/matrix-s13b/, the matrix of session 14's
# engine, traces/matrix-s14/, and the same engine's matrix with schema 7's intake measurements,
# traces/matrix-s15/, then with prompts built before each run, traces/matrix-s15b/ and six cells
# of it on a second machine, traces/matrix-s15c/, and the same matrix on two more machines,
# traces/matrix-s16/ and traces/matrix-s16b/, and today's engine's on two machines,
# traces/matrix-s18/ and traces/matrix-s18b/, then with 256-step segments, traces/matrix-s19/,
# then with the decode kernel's rows on its slowest grid axis, traces/matrix-s20/, and today's
# engine with the start-up heap frozen on an H100, traces/matrix-s22-h100/, again on another H100,
# traces/matrix-s23-h100/, and one chat cell three times on a third, traces/matrix-s24-chat/;
# the engine with the decode prologue on a fourth H100, traces/matrix-s28-h100/, and its chat
# cell three times on a fifth and a sixth, traces/matrix-s28-chat/ and traces/matrix-s28-chat-b/;
# the engine with one staging copy a step on a seventh H100, traces/matrix-s30-h100/; and that
# engine's default cells on an H200, traces/matrix-s33-h200/, with chat three times in one
# process, traces/matrix-s33-h200-chat/; the int32 prompt path's matrix on an eighth H100,
# traces/matrix-s35-h100/, with Azure and bursty three times in one process,
# traces/matrix-s35-h100-spread/; the matrix of the engine whose recorder converts once 4,096
# events wait, on a ninth H100, traces/matrix-s37-h100/, with reference, chat and conversation
# three times, traces/matrix-s37-h100-spread/).
COMMITTED = sorted(p.parent for p in TRACES.glob("*/run.json")) + sorted(
    p.parent for p in TRACES.glob("matrix*/*/run.json"))


def test_the_expected_traces_are_committed() -> None:
    """The CPU sample and the H200 ground-truth traces (today's reference, session 4's pair) are
    present (not silently skipped)."""
    names = {p.name for p in COMMITTED}
    assert {"cpu-tiny-demo", "h200-reference", "h200-reference-s4", "h200-constrained"} <= names
    assert sum(p.parent.name == "matrix" for p in COMMITTED) >= 12
    assert sum(p.parent.name == "matrix-call9" for p in COMMITTED) == 13
    assert sum(p.parent.name == "matrix-call9b" for p in COMMITTED) == 13
    assert sum(p.parent.name == "matrix-s13" for p in COMMITTED) == 4
    assert sum(p.parent.name == "matrix-s13b" for p in COMMITTED) == 6
    assert sum(p.parent.name == "matrix-s14" for p in COMMITTED) == 15
    assert sum(p.parent.name == "matrix-s15" for p in COMMITTED) == 15
    assert sum(p.parent.name == "matrix-s15b" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s15c" for p in COMMITTED) == 6
    assert sum(p.parent.name == "matrix-s16" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s16b" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s18" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s18b" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s19" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s20" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s22-h100" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s23-h100" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s24-chat" for p in COMMITTED) == 3
    assert sum(p.parent.name == "matrix-s28-h100" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s28-chat" for p in COMMITTED) == 3
    assert sum(p.parent.name == "matrix-s28-chat-b" for p in COMMITTED) == 3
    assert sum(p.parent.name == "matrix-s30-h100" for p in COMMITTED) == 16
    assert sum(p.parent.name == "matrix-s33-h200" for p in COMMITTED) == 8
    assert sum(p.parent.name == "matrix-s33-h200-chat" for p in COMMITTED) == 3
    assert sum(p.parent.name == "matrix-s35-h100" for p in COMMITTED) == 13
    assert sum(p.parent.name == "matrix-s35-h100-spread" for p in COMMITTED) == 6
    assert sum(p.parent.name == "matrix-s37-h100" for p in COMMITTED) == 13
    assert sum(p.parent.name == "matrix-s37-h100-spread" for p in COMMITTED) == 9


@pytest.mark.parametrize("cell", ["reference-default-3", "azure-code-default"])
def test_the_s15_matrix_measured_its_intake(cell: str) -> None:
    """Schema 7 recordings stamp every add (``added_s``) and each step's driver time
    (``outside_s``): the reference's first step waited for its 256 adds, its ``outside_s`` the
    span of their stamps and one add more; under Azure's arrivals a long prompt's add costs
    several times a batch's in the reference (docs/BENCHMARKS.md 7k)."""
    from replay.recorded import from_trace
    from replay.whatif.cost.arrivals import fit_add_cost

    events = from_trace(read_trace(TRACES / "matrix-s15" / cell))
    added, steps = events.tables["request_added"], events.tables["model_step"]
    stamps, outside = np.asarray(added["added_s"], float), np.asarray(steps["outside_s"], float)
    assert np.isfinite(stamps).all() and np.isfinite(outside).all() and (outside >= 0).all()
    cost = fit_add_cost(events)
    assert cost.samples > 16
    if cell.startswith("reference"):
        first = stamps[np.asarray(added["step"]) == 0]
        assert len(first) == 256
        span = first.max() - first.min()
        assert span < outside[0] < span + 1e-3
        assert cost.per_token_s < 80e-9
    else:
        assert cost.seconds(2000) > 2e-4  # a 2,000-token prompt: over 0.2 ms on that host


def test_prompts_built_before_the_run_left_the_engines_loop() -> None:
    """Azure's prompts are recipes: built as each request fell due (matrix-s15) they made an add
    cost about twice what it costs with the prompts built before the run (matrix-s15b,
    ``WorkloadInputs.prepare``), and the driver's time between steps halved with it."""
    from replay.recorded import from_trace
    from replay.whatif.cost.arrivals import fit_add_cost

    costs, outside = [], []
    for directory in ("matrix-s15", "matrix-s15b"):
        events = from_trace(read_trace(TRACES / directory / "azure-code-default"))
        costs.append(fit_add_cost(events).seconds(2000))
        outside.append(float(np.sum(events.tables["model_step"]["outside_s"])))
    assert costs[1] < 0.6 * costs[0] and outside[1] < 0.6 * outside[0]


@pytest.mark.parametrize("directory,graphs", [("matrix-s13", False), ("matrix-s14", True)])
def test_the_reference_prefills_left_the_host_with_prefill_graphs_to_16k(directory: str,
                                                                         graphs: bool) -> None:
    """The reference's nine ~16k-token prefills of ~29 prompts ran eager under 4,096-token,
    16-prompt prefill graphs (session 13), their host's launches three quarters of their device
    time; under graphs to 16,384 tokens and 64 prompts (session 14) every one replays a graph
    and the host's share falls below a quarter (docs/gpu-notes.md, session 14)."""
    steps = read_trace(TRACES / directory / "reference-default").columns("model_step")
    prefill = np.asarray(steps["kind"]).astype(str) == "prefill"
    padded = np.asarray(steps["padded_tokens"])[prefill]
    share = (np.asarray(steps["host_s"], float)[prefill].sum()
             / np.asarray(steps["duration_s"], float)[prefill].sum())
    assert prefill.sum() == 9
    if graphs:
        assert (padded > 0).all() and share < 0.25
    else:
        assert (padded == 0).all() and share > 0.5


@pytest.mark.parametrize("trace_dir", COMMITTED,
                         ids=[f"{p.parent.name}/{p.name}" for p in COMMITTED])
def test_committed_trace_verifies(trace_dir: Path) -> None:
    """Replaying the trace reproduces every recorded decision, and the trace is complete."""
    trace = read_trace(trace_dir)
    assert trace.complete
    result = verify(trace_dir)
    assert result.identical, result.report()
    assert result.num_events == trace.num_events


@pytest.mark.parametrize("name", ["h200-reference", "h200-reference-s4", "h200-constrained"])
def test_the_h200_ground_truth_was_recorded_warm_by_todays_engine(name: str) -> None:
    """The H200 traces the simulator's time fidelity is measured on (today's reference, session 4's
    pair) were each recorded after a warm-up run in their process (no one-off compilation in
    any: like with like), under
    today's default deferral rule and with the start-up calibration's eager rows."""
    from engine.config import Config

    header = read_trace(TRACES / name).header
    assert header["engine_starts_before"] >= 1
    assert header["config"]["defer_block_rule"] == Config().defer_block_rule
    eager = {row["prefill_tokens"] for row in header["calibration"]
             if row["kind"] == "prefill" and not row["graph_used"]}
    assert {1, 16, 128, 512, 2048} <= eager
