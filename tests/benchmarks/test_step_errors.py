"""benchmarks/step_errors.py: a recording's steps set beside their prediction per class and bin
of decode rows, every step counted once, and the table's errors those of the two runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchmarks.step_errors import ROW_BINS, compare, main, markdown, predict, step_table

TRACES = Path(__file__).resolve().parents[2] / "traces"
H100 = TRACES / "matrix-s22-h100"
SOURCE = H100 / "reference-default-3"
PROFILE = TRACES / "profiles" / "h100-qwen3-0.6b-s22.profile.json"


def test_every_step_lands_in_one_row_and_idle_waits_are_left_out() -> None:
    """A hand-made run: two prefills, decodes of 2 and 40 rows, and a wait of about 1 s for
    the request added at step 3. Each step is counted in exactly one row, step 3's interval
    starts at that arrival (not at the previous step's end), and the wall shares sum to one."""
    steps = {"step": [0, 1, 2, 3, 4, 5],
             "kind": ["prefill", "decode", "decode", "decode", "prefill", "decode"],
             "graph_used": [False, True, True, True, False, True],
             "wall_time_s": [0.009, 0.010, 0.011, 1.011, 1.020, 1.021],
             "num_seqs": [2, 2, 2, 40, 1, 40],
             "duration_s": [0.009, 0.001, 0.001, 0.004, 0.008, 0.001],
             "host_s": [0.001] * 6}
    added = {"step": [0, 0, 3], "arrival_s": [0.0, 0.0, 1.007]}
    events = SimpleNamespace(tables={"model_step": steps, "request_added": added})
    table = step_table(events)
    assert np.allclose(table["interval"], [0.009, 0.001, 0.001, 0.004, 0.009, 0.001])
    rows = compare(events, events)
    assert [r["steps"] for r in rows] == ["decode_graph 1-3 rows", "decode_graph 32-63 rows",
                                         "prefill"]
    assert sum(r["recorded"]["steps"] for r in rows) == 6
    assert abs(sum(r["recorded"]["wall_share"] for r in rows) - 1.0) < 1e-12
    assert all(r["recorded"] == r["predicted"] for r in rows)


def test_a_source_predicting_itself_prices_its_decode_bins_closely() -> None:
    """The H100 reference predicted from itself and its call's profile: each decode bin of 50
    steps or more has its median interval within 5% of the recording's (the model was fitted on
    these steps; the bins of fewer hold 0.2-0.6% of the run's wall time, BENCHMARKS 7u), the
    same number of decode steps (no arrivals: identical decisions), and a markdown row each."""
    recorded, predicted = predict(str(SOURCE), str(SOURCE), str(PROFILE))
    rows = compare(recorded, predicted)
    decode = [r for r in rows if r["steps"].startswith("decode")]
    assert len(decode) >= 5
    assert (sum(r["recorded"]["steps"] for r in decode)
            == sum(r["predicted"]["steps"] for r in decode))
    large = [r for r in decode if r["recorded"]["steps"] >= 50]
    assert len(large) >= 4
    for row in large:
        a, b = row["recorded"]["interval_ms"], row["predicted"]["interval_ms"]
        assert abs(b / a - 1) < 0.05, row
    assert markdown(rows).count("\n") == len(rows) + 1


def test_few_row_decodes_of_a_conversation_cell_are_priced_high(capsys) -> None:
    """What BENCHMARKS 7u found: predicted from its call's reference, the H100 conversation
    cell's decodes of 1-3 rows run 8-15% longer than recorded (their device time priced high),
    while the bins cover every row count the engine can batch."""
    assert ROW_BINS[0] == 1 and ROW_BINS[-1] > 512
    assert main([str(H100 / "conversation-default"), "--source", str(SOURCE),
                 "--profile", str(PROFILE)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("| decode_graph 1-3 rows"))
    error = float(line.split("|")[4].strip().rstrip("%"))
    assert 8.0 <= error <= 15.0, line


def test_the_mean_interval_shows_a_tail_the_median_hides() -> None:
    """Three decodes of 1 ms and one stalled 5 ms one: the median says 1 ms, the mean 2 ms (a
    cell's TPOT follows the mean); the table carries both, each with its error."""
    steps = {"step": [0, 1, 2, 3, 4], "kind": ["prefill"] + ["decode"] * 4,
             "graph_used": [False] + [True] * 4,
             "wall_time_s": [0.010, 0.011, 0.012, 0.017, 0.018],
             "num_seqs": [2] * 5, "duration_s": [0.010] + [0.001] * 4, "host_s": [0.001] * 5}
    events = SimpleNamespace(tables={"model_step": steps,
                                     "request_added": {"step": [0, 0], "arrival_s": [0.0, 0.0]}})
    row = next(r for r in compare(events, events) if r["steps"].startswith("decode"))
    assert abs(row["recorded"]["interval_ms"] - 1.0) < 1e-9
    assert abs(row["recorded"]["interval_mean_ms"] - 2.0) < 1e-9
    line = next(x for x in markdown([row]).splitlines() if x.startswith("| decode"))
    assert line.count("+0.0%") == 2


def test_cost_options_reach_the_model(capsys) -> None:
    """``--cost-option decode_routes=true`` prices the conversation cell's few-row decodes
    otherwise than the default (the option reaches ``CostModel.fit``)."""
    args = [str(H100 / "conversation-default"), "--source", str(SOURCE), "--profile", str(PROFILE)]
    lines = []
    for extra in ([], ["--cost-option", "decode_routes=true"]):
        assert main(args + extra) == 0
        out = capsys.readouterr().out
        lines.append(next(x for x in out.splitlines() if x.startswith("| decode_graph 1-3")))
    assert lines[0] != lines[1]
