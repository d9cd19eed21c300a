"""SIGTERM (a job scheduler's or a service manager's stop) ends any ``replayllm`` command as
Ctrl-C does, exit 143 (128 + SIGTERM), with its clean-ups run.

Before: only ``run``, ``loadgen``, ``workload``, ``serve`` and ``profile`` handled SIGTERM;
``whatif``, ``tune``, ``verify`` and the rest died at once by Python's default (the parent saw
-15, no message, no clean-up: a grid's workers and a staged ``--out`` left behind). Now
``replay.cli.interrupt.terminate_as_interrupt`` raises ``Terminated`` (a ``KeyboardInterrupt``)
where the command was, and the what-if workers defer SIGTERM as they defer Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from replay.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[3]


def test_a_command_without_its_own_handler_exits_143_after_its_cleanup(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A command signalled mid-work unwinds through its ``finally`` (as on Ctrl-C), prints one
    line and exits 143; SIGTERM's handler is the default again afterwards."""
    cleaned: list[bool] = []

    def slow_command(args: object) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            return 0
        finally:
            cleaned.append(True)

    monkeypatch.setitem(cli_main.COMMANDS, "verify", slow_command)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert cli_main.main(["verify", "some-trace"]) == 143
    assert cleaned == [True]
    assert capsys.readouterr().err == "replayllm verify: interrupted (SIGTERM)\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_ctrl_c_still_exits_130(monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli_main.COMMANDS, "verify", interrupted)
    assert cli_main.main(["verify", "some-trace"]) == 130
    assert capsys.readouterr().err == "replayllm verify: interrupted\n"


# A what-if grid whose workers spend their time sending large results, under the same guard the
# CLI puts around every command; SIGTERM to the whole group (a service manager's stop).
GRID = textwrap.dedent("""
    import sys
    from replay.cli.interrupt import Terminated, terminate_as_interrupt
    from replay.whatif import simulate

    def large_result(workload, overrides, cost, name, keep_events=False):
        return b"x" * 30_000_000

    simulate.run_variant = large_result
    print("ready", flush=True)
    try:
        with terminate_as_interrupt():
            simulate.simulate_many(None, [(str(i), {}) for i in range(40)], None, jobs=4)
    except Terminated:
        print("terminated", flush=True)
        sys.exit(143)
    print("finished", flush=True)
""")


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
def test_sigterm_to_a_whatif_grids_group_ends_every_process_promptly(tmp_path: Path) -> None:
    """SIGTERM to the parent and its workers ends the grid within seconds, exit 143, and no
    worker prints a traceback or leaves the parent waiting on a half-sent result."""
    script = tmp_path / "grid.py"
    script.write_text(GRID)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("still running 30 s after SIGTERM (hung)")
    assert proc.returncode == 143, (out, err)
    assert out.decode().strip() == "terminated"
    assert b"Traceback" not in err, err.decode()


def test_a_worker_raises_once_per_task_however_many_signals_come() -> None:
    """A second signal while the first one's ``KeyboardInterrupt`` unwinds is only noted: raised
    again it landed in the pool's own code and ended the worker with a traceback (6 runs in 12
    of the grid test above, the group's SIGTERM then the parent's SIGINT)."""
    from replay.whatif import worker_signals

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker_signals.install_worker_handler()
        unwound = False
        with pytest.raises(KeyboardInterrupt), worker_signals.interruptible():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            except KeyboardInterrupt:
                os.kill(os.getpid(), signal.SIGINT)  # while the first unwinds: noted only
                time.sleep(0.01)
                unwound = True
                raise
        assert unwound, "the second signal raised again while the first unwound"
        with pytest.raises(KeyboardInterrupt), worker_signals.interruptible():
            pytest.fail("a task started after the worker was interrupted")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
