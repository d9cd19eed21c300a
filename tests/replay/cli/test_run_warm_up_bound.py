"""``replayllm run --warm-up N`` is bounded (``replay.cli.run.MAX_WARM_UP``): each
warm-up loads the model again and runs the whole workload, so a typo (``--warm-up 1000``)
meant hours of untraced runs before the one that counts."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import run_cli

import engine
from replay.cli.run import MAX_WARM_UP


class _Loaded(Exception):
    """Raised in place of loading the model: the checks before it all passed."""


def _no_model(*args: object, **kwargs: object) -> None:
    raise _Loaded


@pytest.mark.parametrize("n", [MAX_WARM_UP + 1, 1000, 10**9, -1])
def test_a_warm_up_count_out_of_range_is_one_line(
        n: int, tmp_path: Path, tiny_workload: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the bound (or negative): one line naming the option and its range, exit 2, no
    model loaded, nothing written at ``--out``. Before: any count over 0 was taken, each one a
    model load (a test's stand-in for the model was reached instead of an error)."""
    monkeypatch.setattr(engine, "LLM", _no_model)
    out = tmp_path / "t"
    code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out", str(out),
                            "--warm-up", str(n)])
    assert code == 2 and not out.exists()
    assert err.count("\n") == 1 and "--warm-up" in err and f"[0, {MAX_WARM_UP}]" in err, err
    assert f"got {n}" in err


def test_a_warm_up_count_out_of_range_is_refused_before_the_workload_is_read(
        tmp_path: Path) -> None:
    """The count is checked first: a bad one is named even where the workload is missing (it
    was checked after the whole workload had been read and checked)."""
    code, _, err = run_cli(["run", "--workload", str(tmp_path / "none.jsonl"),
                            "--out", str(tmp_path / "t"), "--warm-up", str(MAX_WARM_UP + 1)])
    assert code == 2 and "--warm-up" in err, err


@pytest.mark.parametrize("n", [0, 1, MAX_WARM_UP])
def test_a_warm_up_count_in_range_goes_on_to_load_the_model(
        n: int, tmp_path: Path, tiny_workload: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """0 through the bound pass the checks and the run goes on to load the model."""
    monkeypatch.setattr(engine, "LLM", _no_model)
    with pytest.raises(_Loaded):
        run_cli(["run", "--workload", str(tiny_workload), "--out", str(tmp_path / "t"),
                 "--warm-up", str(n)])
