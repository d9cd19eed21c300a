"""``whatif --workload FILE --stream --trace-out DIR``: where the simulated trace may go.

It replaced any complete trace there (``overwrite=True``), a ``replayllm run`` or ``serve``
recording included, with simulated events, in silence; and a ``--trace-out`` inside (or equal
to) ``--out`` was refused only after the whole simulation had run, its results lost. Both are
now one line, exit 2, before any work, the recording untouched; an earlier simulated trace is
still replaced."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import SAMPLE, message_lines, owned_trace, run_cli, snapshot

from tracing.outdir import read_owner


def _stream(workload: Path, out: Path, trace_out: Path) -> tuple[int, str, str]:
    return run_cli(["whatif", "--workload", str(workload), "--timing-from", str(SAMPLE),
                    "--stream", "--no-plots", "--out", str(out), "--trace-out", str(trace_out)])


def test_a_recording_is_never_replaced_by_a_simulated_trace(tmp_path: Path,
                                                            tiny_workload: Path) -> None:
    recording = owned_trace(tmp_path / "recorded")  # as `replayllm run` leaves it
    before = snapshot(recording)
    code, _, err = _stream(tiny_workload, tmp_path / "out", recording)
    assert code == 2
    (line,) = message_lines(err)
    assert "holds a trace recorded by replayllm run" in line
    assert snapshot(recording) == before
    assert not (tmp_path / "out").exists()  # refused before the work


def test_an_earlier_simulated_trace_is_replaced(tmp_path: Path, tiny_workload: Path) -> None:
    trace = tmp_path / "sim"
    for out in ("o1", "o2"):
        code, _, err = _stream(tiny_workload, tmp_path / out, trace)
        assert code == 0, err
    owner = read_owner(trace)
    assert owner is not None and owner["command"] == "whatif"
    assert (trace / "model_step").is_dir()


@pytest.mark.parametrize("where", ["same", "inside", "around"])
def test_trace_out_and_out_overlapping_is_refused_before_the_work(
        tmp_path: Path, tiny_workload: Path, where: str) -> None:
    out = tmp_path / "o"
    trace = {"same": out, "inside": out / "trace", "around": tmp_path}[where]
    if where == "around":
        out = tmp_path / "t" / "o"
    code, text, err = _stream(tiny_workload, out, trace)
    assert code == 2
    (line,) = message_lines(err)
    assert "must be two directories, neither inside the other" in line
    assert "variant" not in text  # nothing simulated
    assert not out.exists()
