"""The engine's "start-up: ..." line is drawn only on a terminal, by the rule the
commands' progress bars follow (``engine.startup_progress.progress_wanted``; the engine cannot
import ``replay``, so the rule lives here)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr

import pytest

from engine import startup_progress
from engine.startup_progress import StartupProgress


class _Terminal(io.StringIO):
    """A captured stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _draw(stderr: io.StringIO) -> str:
    with redirect_stderr(stderr):
        startup = StartupProgress()
        startup.phase("loading model m")
        startup.counter(1, 3)
        startup.close()
    return stderr.getvalue()


def test_no_startup_line_on_a_captured_stderr() -> None:
    """stderr a file or a pipe (``replayllm run 2> log``, a CI job): nothing at all is written.
    Before: ``\\rstart-up [00:00]\\rstart-up: loading model m ...`` carriage-return frames went
    into the log, one per phase, and a blank-padded erase at the end."""
    assert _draw(io.StringIO()) == ""


def test_the_startup_line_is_drawn_on_a_terminal() -> None:
    """On a terminal the line is drawn, as before: each phase, then the calibration counter."""
    err = _draw(_Terminal())
    assert "start-up: loading model m" in err
    assert "start-up: calibrating step times (1/3)" in err


def test_the_rule_is_the_terminal_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """``progress_wanted`` asks whether stderr is a terminal at the time of the call (a
    redirect made after import counts), and ``StartupProgress`` asks it, so forcing the rule
    forces the line: on, a captured stderr gets it; off, a terminal does not."""
    with redirect_stderr(_Terminal()):
        assert startup_progress.progress_wanted()
    with redirect_stderr(io.StringIO()):
        assert not startup_progress.progress_wanted()
    monkeypatch.setattr(startup_progress, "progress_wanted", lambda: True)
    assert "start-up: loading model m" in _draw(io.StringIO())
    monkeypatch.setattr(startup_progress, "progress_wanted", lambda: False)
    assert _draw(_Terminal()) == ""


def test_an_engine_start_up_on_a_captured_stderr_writes_no_frame() -> None:
    """The whole start-up of the tiny engine (``LLM()``: preparing, tokenizer, model, trace),
    as ``replayllm run`` and ``whatif`` with a model do it, leaves a captured stderr free of
    the line. Before: five ``\\rstart-up: ...`` frames."""
    from engine import LLM

    err = io.StringIO()
    with redirect_stderr(err):
        LLM(record_events=False).close()
    assert "start-up" not in err.getvalue() and "\r" not in err.getvalue(), err.getvalue()
