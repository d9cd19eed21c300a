"""Ctrl-C (SIGINT) and SIGTERM in the middle of ``replayllm run`` (a real process).

Before: SIGINT raised ``KeyboardInterrupt`` mid-step and the ``finally: llm.close()`` wrote a
summary, so the prefix read as a *complete* trace of a smaller workload (``inspect`` said
complete, ``whatif`` took it as the whole run); SIGTERM killed the process with no message
(status -15) and lost the events since the last flush. Now both stop between two steps, commit
every step taken, write no summary, and say so in one line (exit 128 + the signal's number).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _cli import REPO, message_lines, run_cli, write_jsonl

from tracing.layout import COMMITS_DIR, SUMMARY_FILE
from tracing.reader import read_trace

# Long enough that no machine finishes it before the signal: the last arrival is at 60 s.
REQUESTS = [{"prompt_token_ids": [1, 2, 3, 4], "max_tokens": 200, "ignore_eos": True,
             "temperature": 0.0, "arrival_s": 1.5 * i} for i in range(41)]
DEADLINE_S = 180  # a slow machine's start-up (the tiny model is built once, then cached)


def _run_until_first_commit(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    workload = write_jsonl(tmp_path / "w.jsonl", REQUESTS)
    trace = tmp_path / "t"
    proc = subprocess.Popen(
        [sys.executable, "-m", "replay.cli.main", "run", "--workload", str(workload),
         "--out", str(trace), "--set", "trace_flush_seconds=0.2"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + DEADLINE_S
    commits = trace / COMMITS_DIR
    while not (commits.is_dir() and any(commits.glob("seg-*.json"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"no segment committed in time: {err.decode()[-2000:]}")
        time.sleep(0.05)
    return proc, trace


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_run_leaves_an_incomplete_trace_and_one_line(
        tmp_path: Path, signum: signal.Signals) -> None:
    proc, trace = _run_until_first_commit(tmp_path)
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    lines = message_lines(err.decode())
    assert proc.returncode == 128 + signum, err.decode()[-2000:]
    assert len(lines) == 1 and lines[0].startswith(
        f"replayllm run: interrupted ({signum.name}): {trace} is an incomplete trace"), lines
    assert not (trace / SUMMARY_FILE).exists()
    got = read_trace(trace)
    assert not got.complete and got.segments >= 1
    # Stopped between steps: each committed step whole, event ids without a gap.
    steps = got.table("model_step").column("step").to_pylist()
    assert steps == list(range(len(steps))) == got.table("batch_scheduled").column(
        "step").to_pylist()
    ids = np.sort(got.events().column("event_id").to_numpy())
    assert ids.tolist() == list(range(got.num_events))
    assert got.counts()["request_added"] < len(REQUESTS)
    code, out, _ = run_cli(["verify", str(trace)])
    assert code == 0 and "identical" in out and "incomplete" in out, out
