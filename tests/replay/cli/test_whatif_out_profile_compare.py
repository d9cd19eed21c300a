"""``whatif``'s report read another command's files, options accepted in silence or
refused only after the step-time model was fitted.

- ``--report`` was built by reading ``--out`` back once the results directory had been renamed
  into place; another whatif finishing into the same ``--out`` right after (they take turns
  under a lock) had its summary and plots in this command's page. The page is now built from
  what this command wrote, read from its own staging directory.
- ``--profile P,P`` pooled a profile with itself (every point's median then leans to it: with
  ``P,P,Q``, Q counted for nothing), and ``--profile A --profile B`` kept B only, both silently.
  A profile named again is now pooled once, with a note; the flag given twice is one line.
- ``--compare OTHER`` where OTHER was recorded with a user policy that cannot be imported
  failed only after the fitting; now one line, exit 2, before it. ``--timing-from`` such a
  trace still prices the steps (by design), and TRACE's own policy is not needed either: the
  prediction runs OTHER's configuration, so only the compare target must be loadable.
- Siblings: ``--host-from`` was read only after the fitting; ``--profile``, ``--host-from`` and
  ``--cost-option`` with ``--workload`` and no ``--timing-from`` were ignored (exit 0).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli import REPO, SAMPLE, one_error, run_cli, user_policy_copy, write_jsonl

import tracing.outdir as outdir
from replay.whatif.report import write_outputs
from replay.whatif.run_outputs import row

PROFILE = REPO / "traces" / "profiles" / "h200-qwen3-0.6b-s33.profile.json"
USER_POLICY = "nomodule38.sched:Gone"
REQUESTS = [{"prompt_token_ids": list(range(1, 9 + i)), "max_tokens": 3, "temperature": 0.0,
             "ignore_eos": True} for i in range(4)]
INTRUDER = "intruder-variant-s38"
OTHER_PNG = b"\x89PNG\r\n\x1a\n another command's plot"




@pytest.fixture
def concurrent_writer(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """Another whatif finishes into the same ``--out`` as soon as this one's output is in
    place: its summary (one row, ``INTRUDER``) and plots (``OTHER_PNG``) replace ours. Returns
    the PNGs this command wrote (name -> bytes), as they were in its staging directory."""
    import replay.cli.tune  # noqa: F401 (binds the real staged_dir by name: never this one)

    real = outdir.staged_dir
    ours: dict[str, bytes] = {}
    replaced: list[str] = []  # once only: a later whatif (another test's) writes undisturbed

    @contextlib.contextmanager
    def staged_then_replaced(path: str, kind: str, command: str, force: bool) -> Iterator[Path]:
        if kind != outdir.WHATIF or replaced:  # another command's output, or done already
            with real(path, kind, command, force) as stage:
                yield stage
            return
        with real(path, kind, command, force) as stage:
            yield stage
            ours.update({p.name: p.read_bytes() for p in stage.iterdir() if p.suffix == ".png"})
        replaced.append(path)
        with real(path, kind, command, force) as other:  # the lock released: the other's turn
            write_outputs(other, [row(INTRUDER, "predicted", None, "cannot run: elsewhere")])
            for name in ours:
                (other / name).write_bytes(OTHER_PNG)

    monkeypatch.setattr(outdir, "staged_dir", staged_then_replaced)
    return ours


@pytest.mark.parametrize("extra", [["--set", "max_num_seqs=2"],
                                   ["--workload", "W", "--stream", "--no-plots",
                                    "--set", "num_kvcache_blocks=64"]])
def test_the_report_holds_this_commands_outputs_not_a_later_writers(
        concurrent_writer: dict[str, bytes], tmp_path: Path, extra: list[str]) -> None:
    """Before: the page's summary table and plots were read from ``--out`` after the rename,
    so they were the other command's (its INTRUDER row, its PNG bytes). Now: this run's."""
    workload = write_jsonl(tmp_path / "w.jsonl", REQUESTS)
    args = [str(workload) if a == "W" else a for a in extra]
    source = [] if "--workload" in args else [str(SAMPLE)]
    report = tmp_path / "page.html"
    code, stdout, stderr = run_cli(["whatif", *source, *args, "--out", str(tmp_path / "out"),
                                    "--report", str(report)])
    assert code == 0, stderr
    page = report.read_text()
    assert INTRUDER in (tmp_path / "out" / "summary.parquet").read_bytes().decode("latin-1")
    assert INTRUDER not in page
    label = "num_kvcache_blocks=64" if "--stream" in args else "max_num_seqs=2"
    assert f"<td>{label}</td>" in page  # the summary table's row of this run's variant
    assert base64.b64encode(OTHER_PNG).decode() not in page
    if "--stream" not in args:
        assert concurrent_writer, stdout  # plots were drawn, and each is ours in the page
        for data in concurrent_writer.values():
            assert base64.b64encode(data).decode() in page


def _model(out: Path) -> str:
    return (out / "cost_model.json").read_text()


def test_a_profile_named_twice_is_pooled_once_with_a_note(tmp_path: Path) -> None:
    """Before: ``--profile P,./P`` pooled P with itself (a model unlike ``--profile P``'s), and
    ``P,P,Q`` took every point's median from P alone (unlike ``P,Q``), no word said. Now the
    repeat is dropped (the same file however spelled) and a note says so."""
    slow = json.loads(PROFILE.read_text())  # another profile of the same setup, twice as slow
    for r in slow["rows"]:
        for name in ("interval_s", "duration_s", "interval_p10_s", "interval_p90_s"):
            if r.get(name) is not None:
                r[name] *= 2
    other = tmp_path / "slow.profile.json"
    other.write_text(json.dumps(slow, indent=1))
    respelled = f"{PROFILE.parent}/../profiles/{PROFILE.name}"
    models, printed = {}, {}
    for name, profile in [("once", f"{PROFILE}"), ("twice", f"{PROFILE}, {respelled}"),
                          ("pair", f"{PROFILE},{other}"),
                          ("triple", f"{PROFILE},{other},{PROFILE}")]:
        out = tmp_path / name
        code, printed[name], stderr = run_cli(["whatif", str(SAMPLE), "--profile", profile,
                                               "--out", str(out), "--no-plots"])
        assert code == 0, stderr
        models[name] = _model(out)
    assert models["twice"] == models["once"]
    assert models["triple"] == models["pair"] != models["once"]
    for name in ("twice", "triple"):
        (note,) = [line for line in printed[name].splitlines() if "more than once" in line]
        assert note.startswith("note: --profile ") and "pooled once" in note
    assert "more than once" not in printed["pair"]


def test_profile_given_twice_is_one_line(tmp_path: Path, fits: list[str]) -> None:
    """Before: ``--profile A --profile B`` used B only, exit 0. Now one line, exit 2, no work."""
    code, stdout, stderr = run_cli(["whatif", str(SAMPLE), "--profile", str(PROFILE),
                                    "--profile", str(PROFILE), "--out", str(tmp_path / "o"),
                                    "--no-plots"])
    assert code == 2
    one_error(stderr, "--profile", "A.json,B.json")
    assert stdout == "" and not fits and not (tmp_path / "o").exists()


def test_compare_with_a_gone_user_policy_fails_before_fitting(tmp_path: Path,
                                                              fits: list[str]) -> None:
    """Before: the step-time model was fitted (its description printed), then exit 2 with a
    line naming neither OTHER nor --compare. Now one line naming OTHER and its policy, exit 2,
    nothing fitted, nothing written."""
    other = user_policy_copy(tmp_path / "other", USER_POLICY)
    out = tmp_path / "out"
    for timing in ([], ["--timing-from", str(SAMPLE)]):
        code, stdout, stderr = run_cli(["whatif", str(SAMPLE), "--compare", str(other),
                                        *timing, "--out", str(out), "--no-plots"])
        assert code == 2
        one_error(stderr, str(other), USER_POLICY, "--compare", "PYTHONPATH")
        assert not fits and "step-time model" not in stdout and not out.exists()


def test_compare_needs_only_the_target_policy(tmp_path: Path) -> None:
    """``--timing-from`` a gone-policy trace still prices ``--compare``'s prediction (kept as
    it was), and a TRACE recorded with a gone user policy is compared with OTHER under OTHER's
    own policy (before: exit 2, TRACE's policy demanded though the prediction never runs it)."""
    gone = user_policy_copy(tmp_path / "gone", USER_POLICY)
    for argv in ([str(SAMPLE), "--compare", str(SAMPLE), "--timing-from", str(gone)],
                 [str(gone), "--compare", str(SAMPLE)]):
        code, stdout, stderr = run_cli(["whatif", *argv, "--out", str(tmp_path / "o"),
                                        "--no-plots"])
        assert code == 0, (argv, stderr)
        assert "decision streams" in stdout


def test_host_from_is_read_before_fitting(tmp_path: Path, fits: list[str]) -> None:
    """Before: ``--host-from`` a missing trace was read only once the model was fitted."""
    code, _, stderr = run_cli(["whatif", str(SAMPLE), "--host-from", str(tmp_path / "gone"),
                               "--out", str(tmp_path / "o"), "--no-plots"])
    assert code == 2
    one_error(stderr, "gone")
    assert not fits


@pytest.mark.parametrize("option", [["--profile", str(PROFILE)], ["--host-from", str(SAMPLE)],
                                    ["--cost-option", "overlap=off"]])
@pytest.mark.parametrize("stream", [False, True])
def test_model_options_without_a_model_are_refused(tmp_path: Path, option: list[str],
                                                   stream: bool) -> None:
    """Before: with ``--workload`` and no ``--timing-from`` (no step-time model at all) these
    were ignored, exit 0. Now one line naming the option and --timing-from, exit 2."""
    workload = write_jsonl(tmp_path / "w.jsonl", REQUESTS)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["whatif", "--workload", str(workload), *option,
                                    "--set", "num_kvcache_blocks=64", "--out", str(out),
                                    "--no-plots", *(["--stream"] if stream else [])])
    assert code == 2, stdout
    one_error(stderr, option[0], "--timing-from")
    assert stdout == "" and not out.exists()
