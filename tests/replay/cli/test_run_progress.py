"""``replayllm run`` draws its progress bar only on a terminal, by the one rule
loadgen and the workload commands follow (``replay.cli.progress.progress_wanted``)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from replay.cli import progress
from replay.cli.main import main

RUN_BAR = "run: 100%"  # tqdm's last frame of the run's bar (desc "run")


class _Terminal(io.StringIO):
    """A captured stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _run(tiny_workload: Path, trace: Path, stderr: io.StringIO) -> str:
    with redirect_stdout(io.StringIO()), redirect_stderr(stderr):
        assert main(["run", "--workload", str(tiny_workload), "--out", str(trace),
                     "--warm-up", "1"]) == 0
    return stderr.getvalue()


def test_no_run_bar_on_a_captured_stderr(tmp_path: Path, tiny_workload: Path) -> None:
    """stderr a file or a pipe (a log, a CI job): no frame of the run's bar, neither the
    warm-up's nor the recorded run's. Before: ``\\rrun: 0%|...`` and ``run: 100%|...`` frames,
    one set per run, went into the log."""
    err = _run(tiny_workload, tmp_path / "t", io.StringIO())
    assert RUN_BAR not in err and "run:" not in err, err


def test_the_run_bar_is_drawn_on_a_terminal(tmp_path: Path, tiny_workload: Path) -> None:
    """On a terminal the bar is drawn, as before: two bars (the warm-up's, the recorded
    run's), each left on its own line once done."""
    err = _run(tiny_workload, tmp_path / "t", _Terminal())
    assert sum(RUN_BAR in line for line in err.split("\n")) == 2, err


def test_the_rule_is_one_place(tmp_path: Path, tiny_workload: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``run`` asks ``progress_wanted`` (as loadgen and the workload commands do), so the rule
    changes in one place: forced on, a captured stderr gets the bar; forced off, a terminal
    does not. Before: run drew a bar whatever the rule said."""
    monkeypatch.setattr(progress, "progress_wanted", lambda: True)
    assert RUN_BAR in _run(tiny_workload, tmp_path / "a", io.StringIO())
    monkeypatch.setattr(progress, "progress_wanted", lambda: False)
    assert RUN_BAR not in _run(tiny_workload, tmp_path / "b", _Terminal())
