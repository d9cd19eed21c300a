"""``whatif`` and ``tune``: reports, the progress rule, ``--host-from`` checked before fitting.

- ``tune --report`` embedded ``pareto.png`` read from ``--out`` after the results directory was
  renamed into place: another tune finishing into the same ``--out`` right after had its plot
  in this command's page. The page now embeds what this command wrote (its staging directory).
- The progress-bar rule had two copies in whatif (``whatif_stream.progress_wanted`` and an
  inline ``isatty()`` for a grid's bar); both now use ``replay.cli.progress``'s.
- ``--host-from X`` with a step-time source that cannot be priced on another host (no host
  times, ``--cost-option overlap=off``, or no eager calibration shape in common with X) was
  refused by ``CostModel.on_host``, only after the model was fitted: now before, one line.
"""

from __future__ import annotations

import base64
import contextlib
import io
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from _cli import REPO, SAMPLE, one_error, run_cli, write_jsonl

import replay.cli.tune as tune_cli
import tracing.outdir as outdir
from replay.cli import progress
from replay.cli.main import main

HOSTED = REPO / "traces" / "h200-reference-s4"  # host times and eager start-up calibration
OTHER_HOST = REPO / "traces" / "h200-reference"
OTHER_PNG = b"\x89PNG\r\n\x1a\n another tune's plot"
OTHER_TABLE = b"another tune's table"
NO_HOST = "no host times or eager start-up calibration"


@pytest.fixture
def concurrent_tune(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """Another tune finishes into the same ``--out`` as soon as this one's output is in place:
    its files replace ours. Returns the files this command wrote (name -> bytes), as they were
    in its staging directory. ``replay.cli.tune`` binds ``staged_dir`` by name: patched there."""
    real = outdir.staged_dir
    ours: dict[str, bytes] = {}

    @contextlib.contextmanager
    def staged_then_replaced(path: str, kind: str, command: str, force: bool) -> Iterator[Path]:
        with real(path, kind, command, force) as stage:
            yield stage
            ours.update({p.name: p.read_bytes() for p in stage.iterdir()})
        with real(path, kind, command, force) as other:  # the lock released: the other's turn
            for name in ours:
                (other / name).write_bytes(OTHER_PNG if name.endswith(".png") else OTHER_TABLE)

    monkeypatch.setattr(tune_cli, "staged_dir", staged_then_replaced)
    return ours


def test_the_tune_report_embeds_this_commands_plot(concurrent_tune: dict[str, bytes],
                                                   tmp_path: Path) -> None:
    """Before: the page's plot was read from ``--out`` after the rename, so it was the other
    tune's (``OTHER_PNG``). Now: this run's own ``pareto.png`` bytes, and only those."""
    out, report = tmp_path / "out", tmp_path / "page.html"
    code, stdout, stderr = run_cli(["tune", str(SAMPLE), "--slo", "ttft_p99=1", "--space",
                                    "max_num_seqs=2,4", "--jobs", "1", "--out", str(out),
                                    "--report", str(report)])
    assert code == 0, stderr
    assert (out / "pareto.png").read_bytes() == OTHER_PNG  # the other command's, in --out
    page = report.read_text()
    assert base64.b64encode(OTHER_PNG).decode() not in page
    assert page.count("data:image/png;base64,") == 1
    assert base64.b64encode(concurrent_tune["pareto.png"]).decode() in page
    assert "<td>max_num_seqs=4</td>" in page and f"wrote {report}" in stdout


def test_tune_report_without_plots_has_none(tmp_path: Path) -> None:
    """``--no-plots``: the page holds the table and no plot (as before)."""
    report = tmp_path / "page.html"
    code, _, stderr = run_cli(["tune", str(SAMPLE), "--slo", "ttft_p99=1", "--space",
                               "max_num_seqs=2,4", "--jobs", "1", "--no-plots", "--out",
                               str(tmp_path / "o"), "--report", str(report)])
    assert code == 0, stderr
    page = report.read_text()
    assert "data:image/png" not in page and "<td>max_num_seqs=4</td>" in page


# --- the progress-bar rule --------------------------------------------------------------------
class _Terminal(io.StringIO):
    """A captured stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _whatif(argv: list[str], stderr: io.StringIO) -> str:
    with redirect_stdout(io.StringIO()), redirect_stderr(stderr):
        assert main(["whatif", *argv]) == 0
    return stderr.getvalue()


def test_the_progress_rule_is_one_place(tmp_path: Path) -> None:
    """No module of replay or the engine but ``engine.startup_progress`` (re-exported by
    ``replay.cli.progress``) asks whether stderr is a terminal, and the whatif commands' rule
    is that one function (not a copy). Before: ``whatif_stream`` defined its own
    ``progress_wanted`` and ``whatif``'s grid bar read ``isatty()`` inline."""
    from engine import startup_progress
    from replay.cli import whatif, whatif_stream

    asking = sorted(str(p.relative_to(REPO)) for package in ("replay", "engine")
                    for p in (REPO / package).rglob("*.py")
                    if "isatty" in p.read_text(encoding="utf-8"))
    assert asking == ["engine/startup_progress.py"]
    assert progress.progress_wanted is startup_progress.progress_wanted
    assert whatif_stream.progress_wanted is progress.progress_wanted
    assert whatif.progress_wanted is progress.progress_wanted


@pytest.mark.parametrize("stream", [False, True])
def test_whatif_bars_follow_the_rule(tmp_path: Path, stream: bool) -> None:
    """The grid's bar and ``--stream``'s bars: drawn on a terminal, none on a captured stderr
    (behaviour kept)."""
    workload = write_jsonl(tmp_path / "w.jsonl", [
        {"prompt_token_ids": [1, 2, 3, 4], "max_tokens": 2, "temperature": 0.0}] * 3)
    argv = (["--workload", str(workload), "--timing-from", str(SAMPLE), "--stream"] if stream
            else [str(SAMPLE)])
    argv += ["--grid", "max_num_seqs=2,4", "--jobs", "1", "--no-plots"]
    bar = "max_num_seqs=4: 100%" if stream else "whatif: 100%"
    assert bar in _whatif([*argv, "--out", str(tmp_path / "a")], _Terminal())
    assert _whatif([*argv, "--out", str(tmp_path / "b")], io.StringIO()) == ""


# --- --host-from before fitting -----------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    # The timing source has no host times (the CPU sample).
    ([str(SAMPLE), "--timing-from", str(SAMPLE), "--host-from", str(HOSTED)],
     [str(SAMPLE), NO_HOST]),
    # TRACE's own model (no --timing-from): the same.
    ([str(SAMPLE), "--host-from", str(HOSTED)], [str(SAMPLE), NO_HOST]),
    # Host times switched off: the model would be of intervals.
    ([str(SAMPLE), "--timing-from", str(HOSTED), "--cost-option", "overlap=off",
      "--host-from", str(OTHER_HOST)], [str(HOSTED), NO_HOST]),
    # The target host's trace has no calibration in common with the source's.
    ([str(SAMPLE), "--timing-from", str(HOSTED), "--host-from", str(SAMPLE)],
     [str(SAMPLE), "0 eager shapes in common"]),
])
def test_host_from_an_unpriceable_source_fails_before_fitting(
        tmp_path: Path, fits: list[str], argv: list[str], words: list[str]) -> None:
    """Before: the step-time model was fitted (slow on a long trace), then ``on_host`` said
    the same. Now one line, exit 2, nothing fitted, nothing printed or written."""
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["whatif", *argv, "--out", str(out), "--no-plots"])
    assert code == 2
    one_error(stderr, *words)
    assert not fits and stdout == "" and not out.exists()


def test_host_from_a_priceable_source_still_prices(tmp_path: Path, fits: list[str]) -> None:
    """A source with host times and calibration is fitted and priced on the other host, as
    before the check."""
    code, stdout, stderr = run_cli(["whatif", str(SAMPLE), "--timing-from", str(HOSTED),
                                    "--host-from", str(OTHER_HOST), "--out",
                                    str(tmp_path / "o"), "--no-plots"])
    assert code == 0, stderr
    assert fits == [str(HOSTED)]
    assert f"{OTHER_HOST}'s start-up calibration" in stdout
