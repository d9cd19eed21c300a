"""Crash safety: a trace whose recording process died reads as the prefix it committed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _trace_helpers import record, reference_like

from tracing import TraceError, layout, read_trace
from tracing.layout import COMMITS_DIR
from tracing.schema import EVENT_KINDS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
START_TIMEOUT_S = 60.0


def _start_writer(trace_dir: Path, mode: str = "kill",
                  writer: str = "thread") -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    return subprocess.Popen(
        [sys.executable, str(HERE / "_crash_writer.py"), str(trace_dir), mode, writer],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _writer_pid(proc: subprocess.Popen[bytes], writer: str) -> int | None:
    """The recorder's writer process (the crash writer's first line), for ``process``."""
    assert proc.stdout is not None
    return int(proc.stdout.readline()) if writer == "process" else None


def _wait_for_exit(pid: int | None) -> None:
    """Wait until process ``pid`` (not our child: the killed writer's) has exited."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while pid is not None and time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    assert pid is None, f"the writer process {pid} did not finish after its engine died"


def _wait_for_commits(proc: subprocess.Popen[bytes], trace_dir: Path, count: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    commits = trace_dir / COMMITS_DIR
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"writer exited early: {proc.stderr.read().decode()[-2000:]}")
        if commits.is_dir() and sum(1 for p in commits.glob("seg-*.json")) >= count:
            return
        time.sleep(0.005)
    raise AssertionError("writer committed too few segments in time")


@pytest.mark.parametrize("kill_after, writer",
                         [(3, "thread"), (11, "thread"), (29, "thread"), (11, "process")])
def test_sigkill_mid_run_leaves_a_readable_prefix(tmp_path: Path, kill_after: int,
                                                  writer: str) -> None:
    """SIGKILL while recording (flush_steps=1): every committed segment loads, the trace is
    incomplete, ``last_step`` is the last committed step and the rows agree with it: steps
    0..last_step each have one batch and one model step, no row is later, and event ids are
    exactly 0..N-1 (no event of a committed step is missing). A writer process outlives its
    engine and commits what it was handed."""
    trace_dir = tmp_path / "t"
    proc = _start_writer(trace_dir, writer=writer)
    pid = _writer_pid(proc, writer)
    try:
        _wait_for_commits(proc, trace_dir, kill_after)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    _wait_for_exit(pid)
    assert proc.returncode == -signal.SIGKILL
    trace = read_trace(trace_dir)
    assert not trace.complete and trace.summary is None
    assert trace.segments >= kill_after
    assert trace.last_step == trace.segment_list()[-1].through_step
    last = trace.last_step
    assert last >= kill_after - 1
    for kind in ("batch_scheduled", "model_step"):
        assert trace.table(kind).column("step").to_pylist() == list(range(last + 1))
    for kind in EVENT_KINDS:
        steps = trace.table(kind).column("step").to_numpy()
        assert (steps <= last).all()
    ids = np.sort(trace.events().column("event_id").to_numpy())
    assert ids.tolist() == list(range(trace.num_events))
    sampled = trace.df("token_sampled").groupby("step").size()
    batches = trace.df("batch_scheduled").set_index("step")["num_seqs"]
    assert (sampled.reindex(batches.index, fill_value=0) <= batches).all()


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_exit_without_close_commits_what_was_flushed(tmp_path: Path, writer: str) -> None:
    """A process that leaves without ``close()`` (an uncaught exception) still commits every
    segment it handed to the writer: the trace is incomplete and stops at the last step."""
    from _crash_writer import EXIT_AFTER_STEPS

    proc = _start_writer(tmp_path / "t", mode="exit", writer=writer)
    _, stderr = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 3, stderr.decode()[-2000:]
    trace = read_trace(tmp_path / "t")
    assert not trace.complete
    assert trace.segments == EXIT_AFTER_STEPS
    assert trace.last_step == EXIT_AFTER_STEPS - 1
    steps = trace.table("model_step").column("step").to_pylist()
    assert steps == list(range(EXIT_AFTER_STEPS))


def _make_trace(tmp: Path) -> Path:
    trace_dir = tmp / "t"
    record(reference_like(8), trace_dir, flush_steps=2)
    (trace_dir / "summary.json").unlink()  # as if the process died before close
    return trace_dir


def test_uncommitted_files_are_ignored(tmp_path: Path) -> None:
    """Files of a segment without a commit marker (a kill between files) are invisible, both to
    ``read_trace`` and, being hidden temporaries, to ``pd.read_parquet``."""
    trace_dir = _make_trace(tmp_path)
    before = read_trace(trace_dir)
    n = before.segments
    # Half a segment n: one file renamed in place, one still temporary, garbage in a third.
    shutil.copy(
        trace_dir / "token_sampled" / "seg-000000.parquet",
        trace_dir / "token_sampled" / f".seg-{n:06d}.parquet.tmp",
    )
    (trace_dir / "model_step" / f".seg-{n:06d}.parquet.tmp").write_bytes(b"half-written")
    (trace_dir / COMMITS_DIR / f".seg-{n:06d}.json.tmp").write_text("{")
    after = read_trace(trace_dir)
    assert after.segments == n and not after.complete
    assert after.counts() == before.counts()
    df = pd.read_parquet(trace_dir / "token_sampled")
    assert len(df) == before.table("token_sampled").num_rows


def test_committed_but_not_yet_renamed_file_is_read(tmp_path: Path) -> None:
    """A kill after the commit marker but before a rename leaves the file under its temporary
    name: the reader still finds it, so the committed segment is whole."""
    trace_dir = _make_trace(tmp_path)
    expected = read_trace(trace_dir).table("seq_scheduled")
    last = read_trace(trace_dir).segments - 1
    final = trace_dir / "seq_scheduled" / f"seg-{last - 1:06d}.parquet"
    final.rename(layout.tmp_path(final))
    got = read_trace(trace_dir).table("seq_scheduled")
    assert got.equals(expected)


def test_missing_marker_in_the_middle_is_an_error(tmp_path: Path) -> None:
    """Segment markers are written in order, so a gap means a deleted marker: TraceError."""
    trace_dir = _make_trace(tmp_path)
    (trace_dir / COMMITS_DIR / "seg-000001.json").unlink()
    with pytest.raises(TraceError, match="seg-000002.json.*segment 1 is not"):
        read_trace(trace_dir)
