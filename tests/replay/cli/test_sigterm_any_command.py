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


def test_a_worker_raises_once_per_task_however_many_signals_come() -> None:
    """A second signal while the first one's ``KeyboardInterrupt`` unwinds is only noted: raised
    again it landed in the pool's own code and ended the worker with a traceback (6 runs in 12
    of tests/replay/whatif/test_hardening_s37_interrupt.py under SIGTERM)."""
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
