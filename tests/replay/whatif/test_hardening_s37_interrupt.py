"""Ctrl-C during a what-if grid: every process exits at once (130), none waits forever.

Before: a terminal's SIGINT reached the pool's workers too; one interrupted while it wrote its
large result to the result pipe left a partial message, the parent's reader waited for its
rest, and ``replayllm whatif --grid`` hung after Ctrl-C (4 runs in 5 here) until killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from replay.whatif import worker_signals

ROOT = Path(__file__).resolve().parents[3]

# Variants whose results are large (as a long trace's are), so that the workers spend their
# time sending them: a SIGINT to the process group lands mid-send.
SCRIPT = textwrap.dedent("""
    import sys
    from replay.whatif import simulate

    def large_result(workload, overrides, cost, name, keep_events=False):
        return b"x" * 30_000_000

    simulate.run_variant = large_result
    print("ready", flush=True)
    try:
        simulate.simulate_many(None, [(str(i), {}) for i in range(40)], None, jobs=4)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    print("finished", flush=True)
""")


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
def test_ctrl_c_during_a_grid_ends_every_process_promptly(tmp_path: Path) -> None:
    """Three Ctrl-Cs (SIGINT to the whole group, as a terminal sends) each end the run with
    the parent's KeyboardInterrupt within seconds, and no worker prints a traceback."""
    script = tmp_path / "grid.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for trial in range(3):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=env)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"trial {trial}: still running 30 s after Ctrl-C (hung)")
        assert proc.returncode == 130, (out, err)
        assert out.decode().strip() == "interrupted"
        assert b"Traceback" not in err, err.decode()


def test_a_worker_interrupted_between_tasks_stops_its_next_task_at_once() -> None:
    """A SIGINT while no task runs is remembered, not raised (it would cut a result's send):
    the worker's next task stops before it starts; one during a task raises in it."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        worker_signals.install_worker_handler()
        os.kill(os.getpid(), signal.SIGINT)  # between tasks: nothing raised here
        time.sleep(0.01)
        with pytest.raises(KeyboardInterrupt), worker_signals.interruptible():
            pytest.fail("the task ran after the worker was interrupted")
        worker_signals.install_worker_handler()
        with pytest.raises(KeyboardInterrupt), worker_signals.interruptible():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGINT, previous)
