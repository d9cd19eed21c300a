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
    from replay.cli.interrupt import Terminated, terminate_as_interrupt
    from replay.whatif import simulate

    def large_result(workload, overrides, cost, name, keep_events=False):
        return b"x" * 30_000_000

    simulate.run_variant = large_result
    print("ready", flush=True)
    try:
        with terminate_as_interrupt():  # as the CLI runs every command
            simulate.simulate_many(None, [(str(i), {}) for i in range(40)], None, jobs=4)
    except Terminated:
        print("terminated", flush=True)
        sys.exit(143)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    print("finished", flush=True)
""")


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
@pytest.mark.parametrize(("signum", "status", "said"), [
    (signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_during_a_grid_ends_every_process_promptly(
        tmp_path: Path, signum: int, status: int, said: str) -> None:
    """Three Ctrl-Cs (SIGINT to the whole group, as a terminal sends), or three SIGTERMs to the
    group (a service manager's stop), each end the run with the parent's KeyboardInterrupt
    (``Terminated`` for SIGTERM) within seconds, and no worker prints a traceback (a worker
    signalled twice, the group's signal then the parent's SIGINT, printed one in 6 runs of 12
    before it raised once per task)."""
    script = tmp_path / "grid.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for trial in range(3):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=env)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(1.0)
        os.killpg(proc.pid, signum)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"trial {trial}: still running 30 s after the signal (hung)")
        assert proc.returncode == status, (out, err)
        assert out.decode().strip() == said
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
