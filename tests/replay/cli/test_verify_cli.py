"""``replayllm verify`` on traces on disk: exit 0 identical, 1 at a divergence, 2 unreadable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.cli.main import main

TRACES = Path(__file__).resolve().parents[3] / "traces"
SAMPLE = TRACES / "cpu-tiny-demo"


@pytest.fixture
def trace_copy(tmp_path: Path) -> Path:
    target = tmp_path / "trace"
    shutil.copytree(SAMPLE, target)
    return target


def test_identical_trace_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """A committed trace verifies: exit 0 and the 'identical: N events over M steps' line."""
    assert main(["verify", str(SAMPLE)]) == 0
    assert capsys.readouterr().out.startswith("identical: ")


def test_edited_block_count_in_header_exits_one(
    trace_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run.json with another pool size: exit 1, the divergence names a block event."""
    header_path = trace_copy / "run.json"
    header = json.loads(header_path.read_text())
    header["config"]["num_kvcache_blocks"] += 3
    header_path.write_text(json.dumps(header))
    assert main(["verify", str(trace_copy)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("diverged at event") and "block_" in out.splitlines()[0]


def test_changed_token_in_a_segment_exits_one(
    trace_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sampled token rewritten inside a Parquet segment is caught (exit 1)."""
    segment = sorted((trace_copy / "token_sampled").glob("seg-*.parquet"))[0]
    table = pq.read_table(segment)
    tokens = table.column("token_id").to_pylist()
    tokens[len(tokens) // 2] += 1
    index = table.schema.get_field_index("token_id")
    field = table.schema.field(index)
    table = table.set_column(index, field, pa.array(tokens, type=field.type))
    pq.write_table(table, segment)
    assert main(["verify", str(trace_copy)]) == 1
    assert "diverged at event" in capsys.readouterr().out


@pytest.mark.parametrize("make_bad", ["missing", "not_a_trace", "random_bytes"])
def test_unreadable_trace_exits_two_with_one_line(
    tmp_path: Path, trace_copy: Path, make_bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing path, a directory that is no trace, a corrupt segment: one line, exit 2."""
    if make_bad == "missing":
        target = tmp_path / "nowhere"
    elif make_bad == "not_a_trace":
        target = tmp_path / "empty"
        target.mkdir()
    else:
        target = trace_copy
        segment = sorted((trace_copy / "seq_scheduled").glob("seg-*.parquet"))[0]
        segment.write_bytes(b"\x00garbage" * 64)
    assert main(["verify", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("replayllm verify: error:") and "\n" not in err
    assert "Traceback" not in err


def test_a_killed_run_that_committed_no_step_is_nothing_to_verify(
    trace_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No summary.json and no commit marker: a killed run that committed nothing. verify used
    to print "identical: 0 events over 0 steps (incomplete trace ...)" and exit 0, a proof of
    nothing; now one line saying there is nothing to verify, exit 2 (as an unreadable trace).
    Keeping the first segment (committed steps) still verifies that prefix, exit 0."""
    (trace_copy / "summary.json").unlink()
    markers = sorted((trace_copy / "_commits").glob("seg-*.json"))
    markers[-1].unlink()
    assert main(["verify", str(trace_copy)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("identical: ") and "verified the recorded prefix, steps 0 to" in out
    markers[0].unlink()
    assert main(["verify", str(trace_copy)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and "\n" not in err
    assert err.startswith("replayllm verify: error: ") and err.endswith(
        "incomplete trace with no committed step (the recording stopped before its first step "
        "was committed): nothing to verify")
