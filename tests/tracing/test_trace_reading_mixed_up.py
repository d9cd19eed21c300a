"""Traces mixed up on their way to a laptop: a ``summary.json`` of another trace, or a trace
whose steps have a gap (a segment deleted and the later ones renumbered, or taken from another
trace). Each is one ``TraceError`` line naming the file, exit 2 from the CLI.

Before: a summary copied from another trace of as many segments and the same version was read
as this trace's (``inspect`` printed the other run's wall time and throughput, ``--json`` too);
a trace with steps missing between two segments read as whole (``inspect`` reported it
"committed through step S", the export drew it, ``verify`` called the hole a divergence of
the scheduler, exit 1).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.replay.cli._cli import run_cli
from tests.tracing._trace_helpers import record, reference_like
from tracing import TraceError, read_trace
from tracing.layout import marker_file, segment_file


def _two_traces(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    record(reference_like(24, seed=1), a, flush_steps=1 << 20)
    record(reference_like(30, seed=2), b, flush_steps=1 << 20)
    return a, b


@pytest.mark.parametrize("field", ["all", "last_step", "num_events", "counts"])
def test_a_summary_of_another_trace_is_refused(tmp_path: Path, field: str) -> None:
    a, b = _two_traces(tmp_path)
    if field == "all":
        shutil.copyfile(b / "summary.json", a / "summary.json")
    else:  # one figure edited: each is checked on its own
        ours = json.loads((a / "summary.json").read_text())
        ours[field] = json.loads((b / "summary.json").read_text())[field]
        (a / "summary.json").write_text(json.dumps(ours))
    with pytest.raises(TraceError, match=f"{a / 'summary.json'}: .*commit markers"):
        read_trace(a)
    code, out, err = run_cli(["inspect", str(a)])
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "summary.json" in err


def test_summaries_of_recorded_traces_still_read(tmp_path: Path) -> None:
    a, b = _two_traces(tmp_path)
    for trace in (a, b):
        assert read_trace(trace).complete


def _drop_segment(trace: Path, drop: int) -> None:
    """Delete segment ``drop`` and renumber the next one into its place (later ones deleted):
    markers and files all well formed, the event ids still rising."""
    (trace / "summary.json").unlink()
    markers = sorted((trace / "_commits").glob("seg-*.json"))
    for marker in markers[drop:]:
        index = int(marker.stem[4:])
        data = json.loads(marker.read_text())
        marker.unlink()
        if index != drop + 1:
            for entry in data["files"].values():
                (trace / entry["file"]).unlink()
            continue
        data["segment"] = drop
        for kind, entry in data["files"].items():
            entry["file"] = segment_file(kind, drop)
            (trace / segment_file(kind, index)).rename(trace / entry["file"])
        (trace / marker_file(drop)).write_text(json.dumps(data))


@pytest.mark.parametrize("drop", [0, 2])
def test_steps_missing_between_segments_are_refused(tmp_path: Path, drop: int) -> None:
    trace = tmp_path / "t"
    record(reference_like(), trace, flush_steps=5)
    _drop_segment(trace, drop)
    marker = trace / marker_file(drop)
    first = 5 * drop
    with pytest.raises(TraceError, match=rf"{marker}: .*steps {first} to {first + 4} are "
                                         "missing"):
        read_trace(trace)
    for command in ("inspect", "verify", "export"):
        code, out, err = run_cli([command, str(trace)])
        assert (code, out) == (2, ""), command
        assert err.count("\n") == 1 and "are missing" in err
