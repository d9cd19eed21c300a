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


# A run whose 4th model call is Ctrl-C'd twice, the second while the first is being handled,
# mid-step (the step's batch already recorded): signal.raise_signal runs the handler at once.
_TWICE = """
import signal, sys
from engine.runner.model_runner import ModelRunner
calls = iter(range(10**6))
def wrap(original):
    def model_call(self, *args, **kwargs):
        if next(calls) == 3:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        return original(self, *args, **kwargs)
    return model_call
for name in ("launch", "execute"):
    setattr(ModelRunner, name, wrap(getattr(ModelRunner, name)))
from replay.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "sequential"])
def test_a_second_ctrl_c_mid_step_still_stops_between_steps(tmp_path: Path,
                                                            overlap: bool) -> None:
    """The second SIGINT raised ``KeyboardInterrupt`` where it landed: mid-step, and the close
    committed that half step (a ``batch_scheduled`` with no ``model_step``), with the bare
    ``replayllm run: interrupted``. Now it is one line and the run stops as after the first."""
    workload = write_jsonl(tmp_path / "w.jsonl", [
        {"prompt_token_ids": [1, 2, 3, i + 4], "max_tokens": 8, "ignore_eos": True,
         "temperature": 0.0} for i in range(4)])
    trace = tmp_path / "t"
    done = subprocess.run(
        [sys.executable, "-c", _TWICE, "run", "--workload", str(workload), "--out", str(trace),
         "--set", "max_num_seqs=2", "--set", f"async_scheduling={str(overlap).lower()}",
         "--set", "trace_flush_steps=1"],
        cwd=REPO, capture_output=True, text=True, timeout=DEADLINE_S)
    lines = message_lines(done.stderr)
    assert done.returncode == 130, done.stderr[-2000:]
    assert lines[0].startswith("replayllm run: SIGINT again: already stopping"), lines
    assert len(lines) == 2 and lines[1].startswith(
        f"replayllm run: interrupted (SIGINT): {trace} is an incomplete trace"), lines
    got = read_trace(trace)
    assert not got.complete and got.last_step >= 1
    steps = got.table("model_step").column("step").to_pylist()
    assert steps == list(range(got.last_step + 1)) == got.table("batch_scheduled").column(
        "step").to_pylist()
    code, out, _ = run_cli(["verify", str(trace)])
    assert code == 0 and "identical" in out and "incomplete" in out, out


def test_the_handler_says_a_second_signal_while_recording_and_raises_before(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Driven directly: the first signal sets the flag; a second one while a traced engine runs
    or closes is a line on stderr, nothing raised; before recording starts it interrupts."""
    from replay.cli import interrupt

    with interrupt.deferred_signals():
        interrupt._on_signal(signal.SIGTERM, None)
        with interrupt.recording():
            interrupt._on_signal(signal.SIGINT, None)
            interrupt._on_signal(signal.SIGINT, None)
            with pytest.raises(interrupt.RunInterrupted) as stop:
                interrupt.check()
        assert stop.value.exit_status == 128 + signal.SIGTERM  # the first signal's
        with pytest.raises(KeyboardInterrupt):
            interrupt._on_signal(signal.SIGINT, None)
    err = capsys.readouterr().err
    assert err.count("replayllm run: SIGINT again: already stopping") == 2, err
